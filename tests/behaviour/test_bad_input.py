"""Hostile input across the commands: each ends in exit 2 and one line naming the file or option at
fault (never "internal error" or a traceback); a closed output pipe ends quietly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PATIENCE, invoke, one_error_line, run_sets
from toy_data import write_corpus, write_spec
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.store import runs

runner = CliRunner()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def corpus(workdir) -> Path:
    return write_corpus(workdir)


@pytest.fixture(scope="module")
def trained(workdir, corpus) -> Path:
    out = workdir / "run"
    result = invoke("train", *run_sets(corpus), "--set", "model.pos_type=rope", "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def copy_of(trained, tmp_path):
    def make(mutate) -> Path:
        run = shutil.copytree(trained, tmp_path / "run")
        mutate(run)
        return run

    return make


# --------------------------------------------------------------------------- weights and sampling


def _nan_last(run: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(run / runs.LAST))
    state["blocks.0.attn.out.weight"][0, 0] = float("nan")  # one NaN: what a diverged step leaves
    save_file(state, str(run / runs.LAST))


@pytest.mark.parametrize("temp", ["0.8", "0"])
def test_sample_refuses_non_finite_weights_and_points_at_best(copy_of, temp):
    run = copy_of(_nan_last)
    result = invoke("sample", run, "--weights", "last", "--temp", temp, "--max-new", 5)
    one_error_line(result, "are not finite")
    assert "--weights best" in result.output and "last.safetensors" in result.output
    assert invoke("sample", run, "--weights", "best", "--temp", temp, "--max-new", 5).exit_code == 0


@pytest.mark.parametrize("temp", ["nan", "inf", "-inf"])
def test_sample_refuses_non_finite_temperature(trained, temp):
    one_error_line(invoke("sample", trained, "--temp", temp, "--max-new", 5), "--temp must be >= 0 and finite")


@pytest.mark.parametrize("option, value, fragment", [("--top-k", 0, "--top-k must be >= 1, got 0"),
                                                     ("--window", 0, "--window must be between 2 and"),
                                                     ("--window", 1, "--window must be between 2 and")])
def test_sample_errors_name_the_flag_at_fault(trained, option, value, fragment):
    """The message names the option the user typed (and --window 0 is not silently ctx_len)."""
    one_error_line(invoke("sample", trained, option, value, "--max-new", 3), fragment)


def test_sample_tiny_temperature_is_near_greedy_not_a_crash(trained):
    tiny = invoke("sample", trained, "--temp", "1e-45", "--max-new", 20, "--prefix", "The")
    greedy = invoke("sample", trained, "--temp", "0", "--max-new", 20, "--prefix", "The")
    assert tiny.exit_code == 0, tiny.output
    assert tiny.output == greedy.output


def test_sample_seed_out_of_torch_range_is_an_option_error(trained):
    result = invoke("sample", trained, "--seed", 2**64, "--max-new", 3)
    assert result.exit_code == 2 and "--seed" in result.output and "internal error" not in result.output


@pytest.mark.process
def test_closed_pipe_ends_quietly(trained):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", "sample", str(trained), "--max-new", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert len(proc.stdout.read(8)) == 8
    proc.stdout.close()  # `| head -c 8`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=PATIENCE) == 141 and err == "", err


# --------------------------------------------------------------------------------------- specs


@pytest.mark.parametrize("setting, fragment", [
    ("train.lr=inf", "train.lr: Input should be a finite number"),
    ("train.lr=nan", "train.lr: Input should be a finite number"),
    ("model.rope_base=inf", "model.rope_base: Input should be a finite number"),
    ("train.sample_temp=inf", "train.sample_temp: Input should be a finite number"),
    ("data.val_frac=nan", "data.val_frac: Input should be a finite number"),
    ("seed=100000000000000000000", "seed: Input should be less than or equal to"),
])
def test_spec_non_finite_or_out_of_range_numbers(corpus, tmp_path, setting, fragment):
    one_error_line(invoke("train", *run_sets(corpus), "--set", setting, "--out", tmp_path / "o"), fragment)
    assert not (tmp_path / "o").exists()


def test_absurd_plans_are_refused_before_expanding(tmp_path):
    spec = write_spec(tmp_path)
    result = invoke("ablate", spec, "--seeds", 10**11, "--dry-run", "--runs-dir", tmp_path / "r")
    assert result.exit_code == 2 and "--seeds" in result.output
    axes = tmp_path / "axes.toml"
    axes.write_text('name = "x"\n[axes]\n"train.warmup" = [' + ", ".join(map(str, range(3000))) + "]\n")
    # 12 configs x 3000
    one_error_line(invoke("ablate", axes, "--dry-run", "--runs-dir", tmp_path / "r"), "the plan has 36,000 runs")
    inf = tmp_path / "inf.toml"
    inf.write_text('name = "x"\n[base.train]\nlr = inf\n')
    one_error_line(invoke("ablate", inf, "--dry-run", "--runs-dir", tmp_path / "r"), "base.train.lr")


# ------------------------------------------------------------------------------ run files read back


def _put(name: str, text: str | bytes):
    def mutate(run: Path) -> None:
        (run / name).write_bytes(text if isinstance(text, bytes) else text.encode())

    return mutate


@pytest.mark.parametrize("name, text, fragment", [
    (runs.SUMMARY, '{"status": "completed", "best_val_loss": "abc"}', 'summary.json in {run}: best_val_loss is "abc"'),
    (runs.SUMMARY, "[1, 2]", "summary.json in {run}: not a JSON object"),
    (runs.SUMMARY, '{"status": "completed", "params": 3.5}', "summary.json in {run}: params is 3.5, not an integer"),
    (runs.SUMMARY, '{"status": 7}', "summary.json in {run}: status is 7, not a string"),
    (runs.METRICS, '{"step": 0, "val_loss": "x"}\n{"step": 1}\n', "metrics.jsonl in {run}: line 1: val_loss"),
    (runs.METRICS, '{"val_loss": 1.0}\n{"step": 1}\n', "metrics.jsonl in {run}: line 1: no step"),
    (runs.METRICS, '{"step": 0}\nnot json\n{"step": 1}\n', "metrics.jsonl in {run}: line 2 is not JSON"),
    (runs.METRICS, b"\xff\xfe\n", "metrics.jsonl in {run}: not UTF-8"),
    (runs.CONFIG, "[1]", "config.json in {run}: not a JSON object"),
    (runs.CONFIG, '{"model": [1]}', "config.json in {run}: 'model' is not a table"),
    ("eval.json", '{"val_loss_by_ctx": {"x": "y"}}', "eval.json in {run}: val_loss_by_ctx['x']"),
    ("eval.json", "[1]", "eval.json in {run}: val_loss_by_ctx is not a table"),
])
def test_report_names_the_corrupt_run_file(copy_of, name, text, fragment):
    run = copy_of(_put(name, text))
    one_error_line(invoke("report", run, "--format", "csv"), fragment.format(run=run))


def test_a_torn_last_metrics_line_is_still_ignored(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "run")
    rows = runs.read_metrics(run)
    with open(run / runs.METRICS, "a") as f:
        f.write('{"step": 13, "train_lo')
    assert runs.read_metrics(run) == rows


def test_eval_replaces_a_corrupt_eval_json(copy_of):
    run = copy_of(_put("eval.json", '{"val_loss_by_ctx": [1], "notes": 3}'))
    result = invoke("eval", run, "--ctx", 8)
    assert result.exit_code == 0, result.output
    assert set(json.loads((run / "eval.json").read_text())["val_loss_by_ctx"]) == {"8"}


def test_check_rejects_an_infinite_tolerance(tmp_path):
    baseline = tmp_path / "b.json"
    baseline.write_text('{"configs": {"2017": {"best_val_loss": 3.0}}}')
    result = invoke("check", write_spec(tmp_path), "--baseline", baseline, "--from-runs", tmp_path,
                    "--tolerance", "inf")
    one_error_line(result, "--tolerance must be a finite number")


# ------------------------------------------------------------------------------- absurd sizes


@pytest.mark.parametrize("setting, fragment", [
    ("model.d_model=18446744073709551616", "model.d_model: Input should be less than or equal to 2147483647"),
    ("train.threads=100000000", "train.threads: Input should be less than or equal to 4096"),
    ("model.d_model=100000", "run too large for this machine: d_model=100000"),
    ("train.batch_size=1000000000", "batch_size=1000000000"),
    ("train.eval_batches=1000000000", "eval_batches=1000000000"),
])
def test_absurd_sizes_are_refused_before_allocating(corpus, tmp_path, setting, fragment):
    result = invoke("train", *run_sets(corpus), "--set", setting, "--out", tmp_path / "o")
    one_error_line(result, fragment)
    if "too large" in result.output or "=1000000000" in setting:
        assert "GiB for one training step" in result.output and "GiB is available on cpu" in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("setting, fragment", [("model.moe_experts=1000000", "moe_experts=1000000"),
                                               ("model.moe_hidden=1000000000", "moe_hidden=1000000000")])
def test_too_large_names_the_field_that_made_it_so(corpus, tmp_path, setting, fragment):
    """A million experts at d_model 32: the refusal names moe_experts, not only d_model and n_layer."""
    result = invoke("train", *run_sets(corpus), "--set", "model.moe=true", "--set", setting, "--out", tmp_path / "o")
    one_error_line(result, "run too large for this machine")
    assert fragment in result.output


def test_sample_window_that_cannot_fit_is_refused(trained):
    one_error_line(invoke("sample", trained, "--window", 10**9, "--max-new", 3), "--window 1000000000 needs about")
    one_error_line(invoke("sample", trained, "--window", 2**40, "--max-new", 3), "--window must be between 2 and")


def test_a_device_file_is_not_a_corpus(tmp_path):
    one_error_line(invoke("prepare", "/dev/zero", "--out", tmp_path / "p"), "corpus is not a regular file: /dev/zero")


def test_an_absurdly_nested_set_key_is_one_line():
    one_error_line(invoke("train", "--set", "a." * 5000 + "b=1"), "is nested deeper than any spec section")


# ------------------------------------------------------------------------------- one error base


@pytest.mark.process
def test_every_bad_input_error_derives_from_one_torch_free_base():
    """The CLI catches InputError alone (exit 2), so a domain error that does not derive from it
    would surface as an 'internal error'. Every exception class of the package is either bad
    input, a directory in use (Locked: exit 3), or named here as something else."""
    import importlib
    import inspect
    import pkgutil

    import anatomy_cli
    from anatomy_cli.spec.errors import InputError
    from anatomy_cli.store.lockfile import Locked

    found = {}
    for info in pkgutil.walk_packages(anatomy_cli.__path__, "anatomy_cli."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        found |= {name: obj for name, obj in vars(module).items()
                  if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name}
    assert {"ConfigError", "RunError", "DataError", "BaselineError", "ExecutorError", "SampleError", "PositionError",
            "CacheFullError", "ExportError"} <= set(found)
    others = {name for name, cls in found.items() if not issubclass(cls, (InputError, Locked))}
    # a worker killed under us (signal, out of memory): not the input's fault; selection runs of --tune-lr that did
    # not finish (study.lr_selection.Unfinished): caught by study.ablation.run_study, which stops and says to rerun; a
    # check of the parts battery that failed (exams.parts_check.CheckFailed, an AssertionError): the battery
    # catches it and reports it as its row, `components check` exits 1 (refuse_broken turns it into a PartError)
    # a write to the standard output that failed (cli.app.OutputError, an OSError): the CLI says which stream, exit 2
    assert others == {"WorkerDied", "Unfinished", "CheckFailed", "OutputError"}
    code = ("import sys, anatomy_cli.spec.errors; "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'anatomy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['anatomy_cli', 'anatomy_cli.spec', 'anatomy_cli.spec.errors']"


# ------------------------------------------------------------------------- resume, nesting, names


@pytest.mark.parametrize("extra, named", [
    (["--steps", "50"], "--steps"), (["--set", "train.lr=1"], "--set"), (["--device", "cpu"], "--device"),
    (["--compile"], "--compile"), (["--dtype", "float32"], "--dtype"), (["--out", "elsewhere"], "--out"),
    (["--overwrite"], "--overwrite"), (["--runs-dir", "elsewhere"], "--runs-dir"), (["spec.toml"], "SPEC"),
    (["--steps", "0", "--set", "x=1"], "--steps, --set"),
])
def test_resume_refuses_options_it_would_ignore(trained, extra, named):
    """A resumed run continues with its recorded config: an option that cannot apply is refused,
    naming it, before anything is read or written (it used to be ignored silently)."""
    before = (trained / runs.METRICS).read_text()
    one_error_line(invoke("train", "--resume", trained, *extra), f"{named}: a resumed run continues with the config")
    assert (trained / runs.METRICS).read_text() == before


def test_nothing_is_trained_or_planned_inside_a_run_or_a_sweep(trained, corpus, tmp_path):
    one_error_line(invoke("train", *run_sets(corpus), "--out", trained / "inner"),
                   f"is inside the run directory {trained}")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / runs.SWEEP).write_text('{"components": []}')
    one_error_line(invoke("train", *run_sets(corpus), "--out", sweep / "mine"),
                   f"is inside the sweep directory {sweep}")
    for runs_dir in (trained, trained / "sub"):
        one_error_line(invoke("ablate", write_spec(tmp_path), "--runs-dir", runs_dir, "--dry-run"),
                       f"is inside the run directory {trained}: a run folder holds one run; choose another --runs-dir")
    assert not (trained / "inner").exists() and not (trained / "sub").exists() and not (sweep / "mine").exists()


def test_a_report_of_a_tree_with_a_run_inside_a_run_names_it(trained, tmp_path):
    outer = shutil.copytree(trained, tmp_path / "sweep" / "outer")
    shutil.copytree(trained, outer / "inner")
    one_error_line(invoke("report", tmp_path / "sweep", "--format", "csv"),
                   f"{outer / 'inner'} is inside the run directory {outer}")


@pytest.mark.parametrize("args, fragment", [
    (["ablate", "--device", "tpu", "--dry-run"], "--device: Input should be 'auto', 'cpu', 'cuda' or 'mps'"),
    (["ablate", "--dtype", "float16", "--dry-run"], "--dtype: Input should be 'float32' or 'bfloat16'"),
    (["train", "--dtype", "float16"], "--dtype: Input should be 'float32' or 'bfloat16'"),
    (["train", "--set", 'data.source=""'], "data.source: String should have at least 1 character"),
])
def test_an_option_s_error_names_the_option(args, fragment, tmp_path):
    one_error_line(invoke(*args, "--runs-dir", tmp_path / "r") if args[0] == "ablate" else invoke(*args), fragment)


@pytest.mark.parametrize("make_args, fragment", [
    (lambda t, run: ["eval", run, "--batches", 10**12], "--batches 1000000000000 x --batch-size 4 windows of 16"),
    (lambda t, run: ["eval", run, "--batch-size", 10**12], "--batches 2 x --batch-size 1000000000000 windows"),
    (lambda t, run: ["bench-decode", "--prefix-len", 10**9, "--new", 2], "--prefix-len 1000000000 + --new 2"),
    (lambda t, run: ["bench-decode", "--d-model", 10**9, "--new", 2], "d_model=1000000000"),
])
def test_exams_refuse_sizes_that_cannot_fit_before_allocating(trained, tmp_path, make_args, fragment):
    result = invoke(*make_args(tmp_path, trained))
    one_error_line(result, fragment)
    assert "GiB is available on cpu" in result.output


@pytest.mark.parametrize("make_args, fragment", [
    (lambda t, run: ["kv-budget", "--config", "/dev/zero"], "config is not a regular file: /dev/zero"),
    (lambda t, run: ["export", run, t / "hf", "--weights", "newest"], "--weights must be best or last"),
    (lambda t, run: ["report", run, "--out", _write(t / "f", "x")], "not a directory (a file is in the way)"),
    (lambda t, run: ["prepare", "--out", run], "is a run directory, not a prepared corpus directory"),
    (lambda t, run: ["prepare", "--out", run / "data"], "is inside the run directory"),
    (lambda t, run: ["eval", run, "--device", "cuda" if not _has_cuda() else "mps"], "--device: "),
])
def test_paths_devices_and_names_are_one_line_naming_the_option(trained, tmp_path, make_args, fragment):
    one_error_line(invoke(*make_args(tmp_path, trained)), fragment)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------------------- warnings


def test_library_warnings_stay_off_stderr_unless_debug(trained, tmp_path, monkeypatch):
    """A torch/pandas/matplotlib UserWarning inside a command (torch's TF32 API notice on a GPU, say)
    is not the user's business: the command prints its own output only; --debug shows it."""
    import warnings

    from anatomy_cli.report import write

    real = write.write_report

    def noisy(*args, **kwargs):
        warnings.warn("a library's UserWarning", UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(write, "write_report", noisy)
    with warnings.catch_warnings(record=True) as shown:  # what would reach stderr
        warnings.simplefilter("always")
        quiet = invoke("report", trained, "--format", "csv", "--out", tmp_path / "a")
    assert quiet.exit_code == 0 and not shown, [str(w.message) for w in shown]
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        loud = runner.invoke(app, ["--debug", "report", str(trained), "--format", "csv", "--out", str(tmp_path / "b")])
    assert loud.exit_code == 0 and [str(w.message) for w in shown] == ["a library's UserWarning"]


@pytest.mark.process
def test_spawned_workers_keep_library_warnings_off_stderr():
    code = ("import warnings\nfrom anatomy_cli.sweep.worker import Worker\n"
            "with Worker() as w:\n    w.call(warnings.warn, 'a warning in the worker')\nprint('done')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONWARNINGS": "always"})
    assert out.stdout.strip() == "done" and "a warning in the worker" not in out.stderr, out.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["train", "ablate"])
def test_an_unavailable_device_names_the_flag_given(corpus, tmp_path, command):
    """--device cuda on a CPU machine: the error names --device (what was typed), not train.device."""
    if command == "train":
        args = ["train", *run_sets(corpus), "--device", "cuda", "--out", tmp_path / "o"]
    else:
        args = ["ablate", write_spec(tmp_path, corpus=corpus, top={"flips": ["rope"]}), "--device", "cuda",
                "--runs-dir", tmp_path / "runs", "--no-report"]
    one_error_line(invoke(*args), "--device: cuda requested but no CUDA device is available")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--tune-shared", "--no-tune-shared"])
def test_tune_shared_without_tune_lr_is_refused_like_the_grid_options(corpus, tmp_path, flag):
    spec = write_spec(tmp_path, corpus=corpus, top={"flips": ["rope"]})
    one_error_line(invoke("ablate", spec, "--runs-dir", tmp_path / "runs", flag, "--dry-run"),
                   f"{flag} sets the [tune] table, which the spec does not have: add --tune-lr")
    assert not (tmp_path / "runs").exists()
