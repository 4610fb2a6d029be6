"""The README's numbers come from results files the tool wrote (experiments/results/<study>.json):
every marked block re-renders to the same text, and no result-like number sits outside one."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
from report_runs import CALLED, anatomy_results, called_sweep

from anatomy_cli.report import results_blocks, results_build, results_file
from anatomy_cli.report.build import build_report
from anatomy_cli.store import records

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # every page that may hold rendered results
EACH_PAGE = pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
# A number with three decimals or more (a loss, a gain, an interval end), with its sign if any.
RESULT_NUMBER = re.compile(r"(?<!arXiv )(?<!arXiv:)(?<![\d.])[+−-]?\d+\.\d{3,}")  # an arXiv id cites, it is no result
PENDING = re.compile(r"<!-- pending-results (?P<study>[\w.-]+) -->(?P<body>.*?)<!-- /pending-results -->", re.DOTALL)


@EACH_PAGE
def test_readme_blocks_match_their_results_files(page):
    text = page.read_text(encoding="utf-8")
    for m in results_blocks.MARK.finditer(text):
        assert (ROOT / results_blocks.RESULTS_DIR / f"{m['study']}.json").is_file(), f"no results file for {m['study']}"
    assert results_blocks.root_of(page) == ROOT  # docs/ pages read the repository's experiments/results/
    assert results_blocks.drifted(text, ROOT) == []
    assert anatomy_results("--check", str(page))[0] == 0


@EACH_PAGE
def test_no_result_number_outside_a_rendered_block(page):
    """Hand-typed results live only in pending regions, and only until their study's file exists."""
    text = page.read_text(encoding="utf-8")
    for m in PENDING.finditer(text):
        assert not (ROOT / results_blocks.RESULTS_DIR / f"{m['study']}.json").exists(), (
            f"experiments/results/{m['study']}.json exists: render the README's pending {m['study']} numbers from "
            f"it (marked blocks, anatomy results README.md)")
    bare = PENDING.sub("", results_blocks.MARK.sub("", text))
    bare = re.sub(r"```.*?```", "", bare, flags=re.DOTALL)  # commands and specs, not results
    assert RESULT_NUMBER.findall(bare) == []


def rendered_study(tmp_path) -> tuple[Path, dict]:
    called_sweep(tmp_path / "runs" / "toy")
    path = results_build.write_results(tmp_path / "doc" / results_blocks.RESULTS_DIR / "toy.json",
                                       build_report(tmp_path / "runs" / "toy"))
    return path, json.loads(path.read_text())


DOC = """# Findings
<!-- results toy ends --><!-- /results -->
<!-- results toy directions --><!-- /results -->
<!-- results toy verdict --><!-- /results -->
<!-- results toy rule --><!-- /results -->
<!-- results toy moves --><!-- /results -->
RoPE gains <!-- results toy gain rope add-one --><!-- /results --> nats
<!-- results toy interval rope add-one --><!-- /results -->, <!-- results toy call rope add-one --><!-- /results -->.
"""


def test_results_file_renders_every_kind_and_drift_fails(tmp_path):
    path, doc = rendered_study(tmp_path)
    assert doc["format"] == results_file.FORMAT and doc["version"] == results_file.VERSION and doc["study"] == "toy"
    assert path.stat().st_size < 20_000 and "curves" not in doc and "runs" in doc  # small: no curves, no paths
    assert {e["flip"]: e["call"] for e in doc["effects"] if e["metric"] == "best_val_bpb"} == {
        f: call for f, (_, call) in CALLED.items()}

    text = results_blocks.update(DOC, tmp_path / "doc")
    rope = next(e for e in doc["effects"] if e["flip"] == "rope" and e["metric"] == "best_val_bpb")
    assert f"RoPE gains <!-- results toy gain rope add-one -->{rope['gain']:+.3f}<!-- /results --> nats" in text
    assert f"| rope | {rope['gain']:+.3f} [{rope['adj_low']:+.3f}, {rope['adj_high']:+.3f}] helps |" in text
    pre = next(e for e in doc["effects"] if e["flip"] == "prenorm" and e["metric"] == "best_val_bpb")
    assert (f"| 1 | prenorm | added to 2017 | +0.405 | [{pre['adj_low']:+.3f}, {pre['adj_high']:+.3f}] | too few "
            f"seeds |") in text  # 2 seeds: no call
    assert "the 2017 end reaches 2.010, seed-to-seed sd 0.010" in text
    assert "Each interval at 99 % (Bonferroni: 0.05 split over the 5 effects), so all 5 hold together" in text
    mde = statistics.median(e["mde"] for e in doc["effects"] if e["metric"] == "best_val_bpb" and e["mde"] is not None)
    assert f"An effect of {mde:.3f} bits/byte is called 80 % of the time" in text
    assert results_blocks.drifted(text, tmp_path / "doc") == []
    assert results_blocks.update(text, tmp_path / "doc") == text

    edited = text.replace(f"{rope['gain']:+.3f}<!-- /results --> nats", "+0.500<!-- /results --> nats")
    assert results_blocks.drifted(edited, tmp_path / "doc") == ["toy gain rope add-one"]
    (tmp_path / "doc" / "README.md").write_text(edited)
    assert anatomy_results("--check", str(tmp_path / "doc" / "README.md"))[0] == 1
    assert anatomy_results(str(tmp_path / "doc" / "README.md"))[0] == 0
    assert (tmp_path / "doc" / "README.md").read_text() == text  # rewritten from the file


def test_results_format_is_forward_compatible(tmp_path):
    path, doc = rendered_study(tmp_path)
    newer_keys = doc | {"something_new": [1, 2]} | {"effects": [e | {"new_field": 1} for e in doc["effects"]]}
    path.write_text(json.dumps(newer_keys))
    same = results_blocks.update(DOC, tmp_path / "doc")
    assert same == results_blocks.update(DOC, tmp_path / "doc")  # unknown keys ignored
    path.write_text(json.dumps(doc | {"version": results_file.VERSION + 1}))
    with pytest.raises(results_file.ResultsError, match="results version 2; this anatomy reads up to 1"):
        results_blocks.update(DOC, tmp_path / "doc")
    with pytest.raises(results_file.ResultsError, match="unknown results block"):
        results_blocks.render(doc, "pie-chart")


@pytest.mark.slow  # writes whole reports with figures: seconds each
def test_report_writes_the_results_file(tmp_path):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    called_sweep(tmp_path / "toy")
    out = tmp_path / "experiments" / "results" / "toy.json"
    result = CliRunner().invoke(app, ["report", str(tmp_path / "toy"), "--results", str(out)])
    assert result.exit_code == 0, result.output
    assert results_file.load(out)["study"] == "toy" and f"results: {out}" in result.stdout


def test_parts_block_shows_quality_speed_size_and_decode_state():
    """The frontier study's table: per added part its loss call, its timed speed call, its total and
    active parameters and its decode state against the reference end's, all from the results file."""
    loss = {"metric": "best_val_bpb", "unit": "abs", "direction": "add-one", "group": "", "family": 2,
            "threshold": 0.03, "threshold_basis": "noise floor", "adj_level": 0.975}
    doc = {"ends": {"reference": {"name": "LLaMA"}}, "effects": [
        loss | {"flip": "moe", "gain": 0.05, "adj_low": 0.02, "adj_high": 0.08, "call": "helps"},
        loss | {"flip": "swa", "gain": -0.01, "adj_low": -0.02, "adj_high": 0.0, "call": "within noise"},
        loss | {"metric": "tokens_per_s", "unit": "%", "flip": "moe", "gain": -40.0, "adj_low": -45.0,
                "adj_high": -35.0, "call": "hurts"}],
        "configs": [{"role": "reference", "params": 1000, "active_params": 1000, "state_bytes_4k": 2**21,
                     "positions": 4096},
                    {"role": "+moe", "params": 3000, "active_params": 1004, "state_bytes_4k": 2**21,
                     "positions": 4096},
                    {"role": "+swa", "params": 1000, "active_params": 1000, "state_bytes_4k": 2**19,
                     "positions": 4096}]}
    lines = results_blocks.render(doc, "parts").strip().splitlines()
    assert lines[0] == ("| part | gain in best val loss | speed (tokens/s) | params (active) | decode state at "
                        "4,096 positions |")
    assert lines[2] == ("| moe | +0.050 [+0.020, +0.080] helps | −40.0 % [−45.0, −35.0] hurts | 3,000 (1,004) "
                        "| 2.00 MiB, 1.00x |")
    assert lines[3] == ("| swa | −0.010 [−0.020, +0.000] within noise | not timed | 1,000 (1,000) "
                        "| 0.50 MiB, 0.25x |")
    assert lines[4] == "| (LLaMA end) | | | 1,000 (1,000) | 2.00 MiB |"
    # speed from the training runs themselves (no timing pass: the row carries the overlap note) is no timing
    doc["effects"][2] |= {"note": "from training runs that may have shared the CPU: not a fair timing"}
    assert "| moe | +0.050 [+0.020, +0.080] helps | not timed |" in results_blocks.render(doc, "parts")


def test_a_results_file_missing_keys_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    (tmp_path / "experiments" / "results" / "bad.json").write_text('{"format": "anatomy-results", "version": 1}')
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results bad parts -->\n<!-- /results -->\n")
    code, err = anatomy_results(str(readme))
    assert code == 2
    err = err.strip()
    assert err.startswith("error: ") and "bad.json cannot render 'parts': KeyError" in err and "\n" not in err
    assert anatomy_results(str(tmp_path / "missing.md"))[0] == 2


def test_ends_say_where_each_end_was_best_and_where_it_ended():
    """The corpus articles' result read from the file: one end overfits, the other still improves; a
    file written before best_step/last_step/final existed renders as it did."""
    def doc(**ends):
        return {"study": "s", "budget": {"steps": 2000, "tokens": 8_192_000}, "seeds": [1],
                "runs": {"total": 2, "completed": 2},
                "ends": {role: {"name": name, "mean": mean, "sd": None, "seeds": 1, **fit}
                         for role, (name, mean, fit) in ends.items()}}

    text = results_blocks.render(doc(reference=("2017", 2.6, {"best_step": 2000, "last_step": 2000, "final": 2.6}),
                              **{"all-on": ("llama", 2.2, {"best_step": 700, "last_step": 2000, "final": 3.2})}),
                          "ends")
    assert "the 2017 end reaches 2.600 at step 2,000, still improving at its last evaluation" in text
    assert "the llama end reaches 2.200 at step 700, then overfits: 3.200 at step 2,000" in text
    middle = doc(reference=("2017", 2.6, {"best_step": 1500, "last_step": 2000, "final": 2.7}))
    middle["ends"]["reference"]["seeds"] = 3
    assert "reaches 2.600 at median step 1,500 (2.700 at step 2,000);" in results_blocks.render(middle, "ends")
    old = results_blocks.render(doc(reference=("2017", 2.6, {})), "ends")
    assert "Best val loss (nats/char), one seed: the 2017 end reaches 2.600; budget 2,000 steps" in old


# ------------------------------------------------------------------ a tuned study (--tune-lr)

TUNED_DOC = """<!-- results tuned tuning --><!-- /results -->
<!-- results tuned lrs --><!-- /results -->
The 2017 end trains at <!-- results tuned lr 2017 --><!-- /results -->, +rope at
<!-- results tuned lr 2017+rope --><!-- /results -->; at the shared LR rope gains
<!-- results tuned shared-gain rope add-one --><!-- /results --> <!-- results tuned shared-interval rope add-one -->
<!-- /results -->, <!-- results tuned shared-call rope add-one --><!-- /results -->.
"""


def tuned_results(tmp_path, optimum=None) -> tuple[Path, dict]:
    """A tuned study trained by test_lr_comparison's fake trainer, its results file written by write_results and
    read back through load (the schema)."""
    from tests.report.test_lr_comparison import tuned_folder

    root = tuned_folder(tmp_path, optimum)
    path = results_build.write_results(tmp_path / "doc" / results_blocks.RESULTS_DIR / "tuned.json", build_report(root))
    return path, results_file.load(path)


def test_a_tuned_study_s_results_file_holds_its_lrs_and_the_shared_lr_comparison(tmp_path):
    from anatomy_cli.report import lr_allowance

    path, doc = tuned_results(tmp_path)  # rope moves the best LR down: negligible tuned, helps at the shared LR
    record = records.read_tune(tmp_path / "runs" / doc["study"])
    assert doc["tuning"]["grid"] == record.grid.model_dump(mode="json") and doc["tuning"]["seeds"] == [1336]
    assert [(a["name"], a["lr"], a["lrs"]) for a in doc["tuning"]["arms"]] == [
        (a.arm, a.lr, a.lrs) for a in record.arms] and [a["lr"] for a in doc["tuning"]["arms"]] == [6e-3, 3e-3]
    row, = doc["tuning"]["comparison"]
    assert (row["flip"], row["call"], row["shared_call"], row["confounded"]) == ("rope", "negligible", "helps", True)
    assert (row["end_arm"], row["variant_arm"], row["end_lr"], row["variant_lr"]) == ("2017", "2017+rope", 6e-3, 3e-3)

    text = results_blocks.update(TUNED_DOC, tmp_path / "doc")
    g = results_blocks._g  # the file's other tables' numbers, the true minus sign included
    assert (f"| rope | added to 2017 | {g(row['gain'])} | [{g(row['adj_low'])}, {g(row['adj_high'])}] | negligible "
            f"| {g(row['shared_gain'])} | [{g(row['shared_low'])}, {g(row['shared_high'])}] | helps | LR-confounded "
            f"| {lr_allowance.lr_text(6e-3)}, {lr_allowance.lr_text(3e-3)} |") in text
    best = {a["name"]: a for a in doc["tuning"]["arms"]}
    assert (f"| 2017+rope | {lr_allowance.lr_text(3e-3)} | {best['2017+rope']['best_loss']:.4f} | "
            f"{best['2017+rope']['sensitivity']:.4f} | 3 | {record.arm('2017+rope').reason} |") in text
    assert f"trains at <!-- results tuned lr 2017 -->{lr_allowance.lr_text(6e-3)}<!-- /results -->" in text
    assert f"shared-gain rope add-one -->{g(row['shared_gain'])}<!-- /results -->" in text and "-->helps<" in text
    assert results_blocks.drifted(text, tmp_path / "doc") == []

    bad = json.loads(path.read_text())  # the schema types the key: a wrong value is refused by name
    bad["tuning"]["comparison"][0]["confounded"] = "yes"
    path.write_text(json.dumps(bad))
    with pytest.raises(results_file.ResultsError,
                       match=r"tuning\.comparison\[0\]\.confounded: Input should be a valid"):
        results_file.load(path)


def test_a_config_not_tuned_shows_as_not_tuned(tmp_path):
    from anatomy_cli.report import lr_allowance

    _, doc = tuned_results(tmp_path, {"2017": 6e-3, "2017+rope": 0.05})  # +rope's best past the extended edge
    arm = next(a for a in doc["tuning"]["arms"] if a["name"] == "2017+rope")
    row, = doc["tuning"]["comparison"]
    assert arm["lr"] is None and row["gain"] is None and row["call"] == "not tuned"
    table = results_blocks.render(doc, "tuning")
    assert f"| rope | added to 2017 | n/a | — | not tuned | {results_blocks._g(row['shared_gain'])} |" in table
    assert table.rstrip().endswith(f"| {lr_allowance.lr_text(6e-3)}, not tuned |") and "LR-confounded" not in table
    assert results_blocks.render(doc, "lr 2017+rope") == "not tuned"
    assert f"| 2017+rope | not tuned | {arm['best_loss']:.4f} |" in results_blocks.render(doc, "lrs")


def test_a_study_not_tuned_refuses_the_tuning_blocks_in_one_line(tmp_path, capsys):
    path, doc = rendered_study(tmp_path)
    assert "tuning" not in doc
    for what in ("tuning", "lrs", "lr 2017", "shared-call rope add-one"):
        with pytest.raises(results_file.ResultsError, match="^toy: no tuning results \\(the study was not run with "
                                                       "--tune-lr\\)$"):
            results_blocks.render(doc, what)
    readme = tmp_path / "doc" / "README.md"
    readme.write_text("<!-- results toy tuning -->\n<!-- /results -->\n")
    code, err = anatomy_results(str(readme))
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert err.endswith("toy.json cannot render 'tuning': ResultsError: toy: no tuning results (the study was not "
                        "run with --tune-lr)\n")
    old = results_file.load(ROOT / results_blocks.RESULTS_DIR / "demo.json")  # written before the key: still loads
    assert "tuning" not in old and results_blocks.render(old, "verdict").count("\n") > 3
    with pytest.raises(results_file.ResultsError, match="demo: no tuning results"):
        results_blocks.render(old, "lrs")
