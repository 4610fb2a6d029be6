"""Files the tool wrote earlier and reads back (#30 class 3): a results file, a sweep's timing.json, a CI
baseline and a run's eval.json are each read through a typed model, so a mistyped, negative or
non-finite value is one line naming the file and the field, exit 2, never a traceback; a newer results
version is refused by name."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from report_runs import anatomy_results, called_sweep
from toy_data import write_spec
from typer.testing import CliRunner

from anatomy_cli.report import gate, results_blocks, results_file
from anatomy_cli.store import records, runs

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / results_blocks.RESULTS_DIR
DOCS = {  # every block kind each study's file renders
    "demo": "".join(f"<!-- results demo {w} --><!-- /results -->\n" for w in (
        "ends", "verdict", "directions", "rule", "moves", "parts", "gain rope add-one", "interval rope add-one",
        "call rope add-one")),
    "scale": "".join(f"<!-- results scale {w} --><!-- /results -->\n" for w in ("scale", "trend rope add-one")),
}
runner = CliRunner()


def put(doc, where: str, value) -> None:
    """doc at 'ends.reference.mean' / 'effects.0.gain' set to value (a missing last key: deleted)."""
    *path, last = [int(p) if p.isdigit() else p for p in where.split(".")]
    for p in path:
        doc = doc[p]
    if value is DELETE:
        del doc[last]
    else:
        doc[last] = value


DELETE = object()


def study(tmp_path: Path, name: str = "demo", where: str | None = None, value=None) -> tuple[Path, Path]:
    """(README.md rendering every block of the study, its results file): a copy of the committed
    file, with `where` set to `value`."""
    doc = json.loads((COMMITTED / f"{name}.json").read_text(encoding="utf-8"))
    if where is not None:
        put(doc, where, value)
    path = tmp_path / results_blocks.RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")  # NaN and Infinity as Python's json writes them
    readme = tmp_path / "README.md"
    readme.write_text(DOCS[name], encoding="utf-8")
    return readme, path


def error_of(capsys, argv: list[str]) -> str:
    """`anatomy results ARGV`'s exit 2 and its one stderr line."""
    code, err = anatomy_results(*argv)
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    (line,) = err.splitlines()
    assert line.startswith("error: "), line
    return line


# ------------------------------------------------------------------------------------ results files

TOP = [  # one per top-level key: a value of another type
    ("version", "1", "Input should be a valid integer"),
    ("study", 7, "Input should be a valid string"),
    ("runs", [36, 36], "Input should be a valid dictionary"),
    ("seeds", "1,2,3", "Input should be a valid list"),
    ("budget", "x", "Input should be a valid dictionary"),
    ("ends", [], "Input should be a valid dictionary"),
    ("effects", {}, "Input should be a valid list"),
    ("eval_gains", None, "Input should be a valid list"),
    ("configs", "x", "Input should be a valid list"),
]
NESTED = [
    ("ends.reference.mean", "3.8", "Input should be a valid number"),
    ("effects.0.gain", [1], "Input should be a valid number"),
    ("runs.total", -1, "Input should be greater than or equal to 0"),
    ("runs.completed", 2.5, "Input should be a valid integer"),
    ("seeds.1", 2.5, "Input should be a valid integer"),
    ("budget.steps", "300", "Input should be a valid integer"),
    ("budget.tokens", -307200, "Input should be greater than or equal to 0"),
    ("ends.all-on.seeds", True, "Input should be a valid integer"),
    ("ends.reference.sd", -0.1, "Input should be greater than or equal to 0"),
    ("effects.2.adj_level", math.nan, "Input should be a finite number"),
    ("effects.1.adj_high", math.inf, "Input should be a finite number"),
    ("effects.0.call", None, "Input should be a valid string"),
    ("eval_gains.0.steps.1", "30", "Input should be a valid integer"),
    ("eval_gains.0.gain", 0.5, "Input should be a valid list"),
    ("configs.0.params", 1.5, "Input should be a valid integer"),
    ("configs.0.state_bytes_4k", -1, "Input should be greater than or equal to 0"),
    ("version", 0, "Input should be greater than or equal to 1"),
]
SCALE = [
    ("scale", [], "Input should be a valid dictionary"),
    ("scale.sizes.0.non_embedding_params", "55680", "Input should be a valid number"),
    ("scale.trends.0.call", 3, "Input should be a valid string"),
    ("scale.effects.0.gain", {"v": 1}, "Input should be a valid number"),
]
CASES = [("demo", *c) for c in TOP + NESTED] + [("scale", *c) for c in SCALE]


@pytest.mark.parametrize("name, where, value, what", CASES, ids=[f"{n}:{w}={v!r}" for n, w, v, _ in CASES])
def test_a_mistyped_results_field_is_one_line_naming_it(tmp_path, capsys, name, where, value, what):
    readme, path = study(tmp_path, name, where, value)
    field = where.split(".")
    field = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in field).lstrip(".")
    line = error_of(capsys, [str(readme)])
    assert line == f"error: {path.resolve()}: {field}: {what}"
    assert error_of(capsys, ["--check", str(readme)]) == line


def test_a_results_row_whose_lists_differ_in_length(tmp_path, capsys):
    readme, path = study(tmp_path, "demo", "eval_gains.0.tokens", [0.0])
    assert error_of(capsys, [str(readme)]) == (f"error: {path.resolve()}: eval_gains[0]: steps, tokens and gain "
                                               f"differ in length (one value of each per evaluation)")


def test_a_results_file_nested_past_the_recursion_limit(tmp_path, capsys):
    readme, path = study(tmp_path, "demo")
    path.write_text('{"format": "anatomy-results", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert error_of(capsys, [str(readme)]).startswith(f"error: cannot read results file {path.resolve()}: ")


def test_every_committed_results_file_reads_and_renders(tmp_path, capsys):
    for path in sorted(COMMITTED.glob("*.json")):
        assert results_file.load(path) == json.loads(path.read_text(encoding="utf-8"))  # the plain dict, untouched
    for name in DOCS:
        readme, _ = study(tmp_path / name, name)
        assert anatomy_results(str(readme))[0] == 0 and anatomy_results("--check", str(readme))[0] == 0
        assert "<!-- /results -->" in readme.read_text() and "n/a" not in readme.read_text()


def test_a_results_file_of_another_format_or_a_newer_version(tmp_path, capsys):
    readme, path = study(tmp_path, "demo", "format", 3)
    line = error_of(capsys, [str(readme)])
    assert line.startswith(f"error: {path.resolve()} is not an anatomy results file") and "format" in line
    readme, path = study(tmp_path, "demo", "version", 99)
    assert error_of(capsys, [str(readme)]) == (f"error: {path.resolve()} is results version 99; this anatomy "
                                               f"reads up to {results_file.VERSION}")
    doc = json.loads(path.read_text()) | {"ends": [], "version": 2}  # a newer file is refused by its version
    path.write_text(json.dumps(doc))
    assert "results version 2; this anatomy reads up to 1" in error_of(capsys, [str(readme)])
    path.write_text("[1, 2]")
    assert error_of(capsys, [str(readme)]).startswith(f"error: {path.resolve()} is not an anatomy results file")


def test_results_files_may_lack_keys_and_carry_unknown_ones(tmp_path, capsys):
    """Keys are optional (older files lack later ones; a block that needs one says so) and unknown keys,
    anywhere, are ignored: only a present key of the wrong type is refused."""
    readme, path = study(tmp_path, "demo")
    doc = json.loads(path.read_text())
    newer = doc | {"something_new": [1]} | {"ends": {r: e | {"new": "x"} for r, e in doc["ends"].items()}}
    path.write_text(json.dumps(newer))
    assert anatomy_results(str(readme))[0] == 0
    rendered = readme.read_text()
    path.write_text(json.dumps(doc))
    assert anatomy_results("--check", str(readme))[0] == 0 and readme.read_text() == rendered
    del doc["eval_gains"]
    path.write_text(json.dumps(doc))
    line = error_of(capsys, [str(readme)])
    assert "cannot render 'moves': KeyError: 'eval_gains'" in line


MAIN_CASES = [("version", "1", "version: Input should be a valid integer"),
              ("ends", [], "ends: Input should be a valid dictionary"),
              ("budget", "x", "budget: Input should be a valid dictionary")]


@pytest.mark.process
@pytest.mark.parametrize("where, value, said", MAIN_CASES, ids=[c[0] for c in MAIN_CASES])
def test_python_m_results_says_one_line(tmp_path, where, value, said):
    """`python -m anatomy_cli results README.md` (as `make results` runs it), in the folder."""
    study(tmp_path, "demo", where, value)
    env = os.environ | {"PYTHONPATH": str(Path(results_blocks.__file__).parents[2])}  # the anatomy_cli tested here
    for argv in (["README.md"], ["--check", "README.md"]):
        done = subprocess.run([sys.executable, "-m", "anatomy_cli", "results", *argv], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines() == [f"error: {Path('experiments/results/demo.json')}: {said}"]


# ------------------------------------------------------------------------------------ timing.json

RECORD = {"steps": 2, "warmup": 1, "rounds": 2, "threads": 1, "ends": ["2017", "llama"],
          "configs": [{"slug": s, "role": r, "flip": f, "group": ""} for s, r, f in (
              ("a", "reference", None), ("b", "add-one", "rope"), ("c", "all-on", None),
              ("d", "remove-one", "rope"))],
          "rounds_data": [{"a": 100.0, "b": 110.0, "c": 120.0, "d": 90.0}, {"a": 101.0, "b": 108.0, "c": 119.0,
                                                                           "d": 92.0}]}
TIMING = [  # (where, value, the field as named, what)
    ("configs.0.role", DELETE, "configs[0].role", "Field required"),
    ("configs.1.flip", 3, "configs[1].flip", "Input should be a valid string"),
    ("rounds_data.0.b", "fast", "rounds_data[0]['b']", "Input should be a valid number"),
    ("rounds_data.1.a", -100.0, "rounds_data[1]['a']", "Input should be greater than or equal to 0"),
    ("rounds_data.0.a", math.inf, "rounds_data[0]['a']", "Input should be a finite number"),
    ("rounds_data.0", [1], "rounds_data[0]", "Input should be a valid dictionary"),
    ("steps", "2", "steps", "Input should be a valid integer"),
    ("warmup", -1, "warmup", "Input should be greater than or equal to 0"),
    ("threads", 0, "threads", "Input should be greater than or equal to 1"),
    ("ends", ["2017"], "ends", "List should have at least 2 items after validation, not 1"),
    ("configs", {}, "configs", "Input should be a valid list"),
]


def timing_sweep(folder: Path, where: str | None = None, value=None) -> Path:
    record = json.loads(json.dumps(RECORD))
    if where is not None:
        put(record, where, value)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / runs.TIMING).write_text(json.dumps(record, indent=2))
    return folder


def test_a_valid_timing_record_reads_back_as_written(tmp_path):
    assert records.read_timing(timing_sweep(tmp_path)) == RECORD
    assert records.read_timing(tmp_path / "none") is None


@pytest.mark.parametrize("where, value, field, what", TIMING, ids=[c[0] for c in TIMING])
def test_a_corrupt_timing_record_is_one_line(tmp_path, where, value, field, what):
    sweep = timing_sweep(tmp_path / "sweep", where, value)
    with pytest.raises(runs.RunError) as err:
        records.read_timing(sweep)
    assert str(err.value) == f"corrupt timing.json in {sweep}: {field}: {what}"


def test_a_timing_record_that_is_not_an_object(tmp_path):
    (tmp_path / runs.TIMING).write_text("[1]")
    with pytest.raises(runs.RunError, match=r"^corrupt timing.json in .*: not a JSON object$"):
        records.read_timing(tmp_path)


REPORTED = TIMING[:3] + TIMING[6:7]


@pytest.mark.parametrize("where, value, field, what", REPORTED, ids=[c[0] for c in REPORTED])
def test_report_on_a_sweep_with_a_corrupt_timing_record_says_one_line(tmp_path, where, value, field, what):
    """The report stops (exit 2) rather than go on without the timing pass: a timing.json it cannot read
    is a fault to fix (rerun `anatomy ablate --time`), not a record to skip in silence."""
    sweep = tmp_path / "toy"
    called_sweep(sweep)
    timing_sweep(sweep, where, value)
    result = invoke("report", sweep, "--format", "csv")
    line = one_error_line(result, alone=True)
    assert line == f"error: corrupt timing.json in {sweep}: {field}: {what}"


# ------------------------------------------------------------------------------------ CI baseline

GOOD_BASELINE = {"spec": "ci", "gate_seed": 1, "pooled_seed_std": 0.03, "derivation": "x", "torch_version": "2.13",
                 "machine": "cpu", "cpu_capability": None, "platform": "Linux", "measured_on": "2026-11-30",
                 "configs": {"a": {"best_val_loss": 3.0, "seed_values": {"1": 3.0, "2": 3.1, "3": None},
                                   "seed_std": 0.07, "tolerance": 0.1}}}
BASELINE = [
    ("configs.a.seed_values", "x", "configs['a'].seed_values", "Input should be a valid dictionary"),
    ("configs.a.seed_values.1", "3.0", "configs['a'].seed_values['1']", "Input should be a valid number"),
    ("configs.a.seed_std", -0.1, "configs['a'].seed_std", "Input should be greater than or equal to 0"),
    ("configs.a.best_val_loss", -3.0, "configs['a'].best_val_loss", "Input should be greater than or equal to 0"),
    ("pooled_seed_std", "0.03", "pooled_seed_std", "Input should be a valid number"),
    ("pooled_seed_std", math.nan, "pooled_seed_std", "Input should be a finite number"),
    ("spec", 3, "spec", "Input should be a valid string"),
    ("measured_on", 20261130, "measured_on", "Input should be a valid string"),
]


def baseline_file(path: Path, where: str | None = None, value=None) -> Path:
    data = json.loads(json.dumps(GOOD_BASELINE))
    if where is not None:
        put(data, where, value)
    path.write_text(json.dumps(data))
    return path


def test_good_baselines_read_back_as_written(tmp_path):
    committed = ROOT / "experiments" / "ci-baseline.json"
    assert gate.load_baseline(committed) == json.loads(committed.read_text())
    assert gate.load_baseline(baseline_file(tmp_path / "b.json")) == GOOD_BASELINE
    old = {"configs": {"a": {"best_val_loss": 3.0}}, "future_key": [1]}  # fields missing or unknown: fine
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert gate.load_baseline(tmp_path / "old.json") == old


@pytest.mark.parametrize("where, value, field, what", BASELINE, ids=[f"{c[0]}={c[1]!r}" for c in BASELINE])
def test_a_corrupt_baseline_field_is_named(tmp_path, where, value, field, what):
    path = baseline_file(tmp_path / "b.json", where, value)
    with pytest.raises(gate.BaselineError) as err:
        gate.load_baseline(path)
    assert str(err.value) == f"baseline {path}: {field}: {what}"


@pytest.mark.parametrize("where, value, field, what", BASELINE[:1] + BASELINE[4:5],
                         ids=[c[0] for c in BASELINE[:1] + BASELINE[4:5]])
def test_check_with_a_corrupt_baseline_says_one_line_before_any_run(tmp_path, where, value, field, what):
    """`anatomy check --baseline` reads the baseline before it trains or reads a run: --from-runs names a
    folder that does not exist, so only the baseline can be what the line names."""
    path = baseline_file(tmp_path / "b.json", where, value)
    result = invoke("check", write_spec(tmp_path), "--baseline", path, "--from-runs", tmp_path / "no-runs")
    assert one_error_line(result, alone=True) == f"error: baseline {path}: {field}: {what}"


# ------------------------------------------------------------------------------------ eval.json

EVAL = [  # (eval.json, the field as named, what)
    ({"val_loss_by_ctx": {"²": 2.1}}, "val_loss_by_ctx['²']", "not a context length (a whole number > 0)"),
    ({"val_loss_by_ctx": {"0": 2.1}}, "val_loss_by_ctx['0']", "not a context length (a whole number > 0)"),
    ({"val_loss_by_ctx": {"064": 2.1}}, "val_loss_by_ctx['064']", "not a context length (a whole number > 0)"),
    ({"val_loss_by_ctx": {"64": -2.1}}, "val_loss_by_ctx['64']", "a loss is never negative"),
    ({"val_loss_by_ctx": {"64": "2.1"}}, "val_loss_by_ctx['64']", "Input should be a valid number"),
    ({"val_loss_by_ctx": {"64": 2.1}, "ctx_len": "64"}, "ctx_len", "Input should be a valid integer"),
    ({"val_loss_by_ctx": {"64": 2.1}, "batches": 0}, "batches", "Input should be greater than or equal to 1"),
    ({"val_loss_by_ctx": {"64": None}, "notes": {"64": 3}}, "notes['64']", "Input should be a valid string"),
    ({"val_loss_by_ctx": {"64": 2.1}, "dtype": None}, "dtype", "Input should be a valid string"),
]


@pytest.mark.parametrize("data, field, what", EVAL, ids=[c[1] + "=" + json.dumps(c[0])[:30] for c in EVAL])
def test_a_corrupt_eval_json_is_one_line(tmp_path, data, field, what):
    path = tmp_path / runs.EVAL
    path.write_text(json.dumps(data))
    with pytest.raises(runs.RunError) as err:
        runs.read_ctx_losses(path)
    assert str(err.value) == f"corrupt eval.json in {tmp_path}: {field}: {what}"


def test_eval_json_reads_as_before(tmp_path):
    path = tmp_path / runs.EVAL
    path.write_text('{"val_loss_by_ctx": {"64": 2.1, "128": null, "256": NaN}, "ctx_len": 64, "notes": '
                    '{"128": "past the table"}, "label": "x", "weights": "best", "batch_size": 4, "batches": 2, '
                    '"dtype": "float32", "pos_type": "rope", "new": 1}')
    losses = runs.read_ctx_losses(path)
    assert list(losses) == [64, 128, 256] and losses[64] == 2.1 and losses[128] is None and math.isnan(losses[256])
    path.write_text('{"val_loss_by_ctx": {"x": "y"}}')  # the wording test_bad_input.py pins
    with pytest.raises(runs.RunError, match=r"eval.json in .*: val_loss_by_ctx\['x'\]"):
        runs.read_ctx_losses(path)
    path.write_text("[1]")
    with pytest.raises(runs.RunError, match="eval.json in .*: val_loss_by_ctx is not a table"):
        runs.read_ctx_losses(path)


@pytest.mark.parametrize("data, field, what", EVAL[:1] + EVAL[3:4] + EVAL[5:6], ids=["key", "negative", "ctx_len"])
def test_report_on_a_run_with_a_corrupt_eval_json_says_one_line(tmp_path, data, field, what):
    sweep = tmp_path / "toy"
    called_sweep(sweep)
    run = sweep / "base-s1"
    (run / runs.EVAL).write_text(json.dumps(data))
    result = invoke("report", sweep, "--format", "csv")
    assert one_error_line(result, alone=True) == f"error: corrupt eval.json in {run}: {field}: {what}"


def test_a_file_nested_past_the_recursion_limit_is_one_line(tmp_path):
    """store.runs.read_json (timing.json, baselines, eval.json): nesting past Python's recursion limit
    was an internal error."""
    from anatomy_cli.store import runs as runs_store

    path = tmp_path / "timing.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(runs_store.RunError, match="corrupt timing.json"):
        runs_store.read_json(path)


def test_an_unclosed_results_marker_is_one_line_naming_its_line(tmp_path, capsys):
    """A marker left open was rendered as nothing, without a word."""

    page = tmp_path / "README.md"
    page.write_text("# x\n\nthe gain <!-- results toy gain rope add-one -->+0.1 and no close\n", encoding="utf-8")
    assert results_blocks.unclosed(page.read_text()) == [3]
    code, err = anatomy_results("--check", str(page))
    assert code == 2
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "line 3" in err[0] and "no closing" in err[0]
    assert results_blocks.unclosed("<!-- results a b -->x<!-- /results -->") == []
