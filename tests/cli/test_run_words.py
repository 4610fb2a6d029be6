"""What train, sample and prepare say (issue 38): a path is printed on one line whatever the width (it
is copied into `sample` and `--resume`); `train --help` and the README say the default run, from the
config's defaults; `sample` on a sweep folder names one of its runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import flat, invoke, one_error_line, run_sets
from toy_data import write_corpus
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.spec.config import RunConfig
from anatomy_cli.store import runs

ROOT = Path(__file__).resolve().parents[2]
LONG = "a-folder-whose-name-is-long-enough-to-wrap-at-sixty-columns"


def _narrow(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "60"})


def test_train_prints_its_run_path_on_one_line_at_60_columns(tmp_path):
    run = tmp_path / LONG / "run"
    result = _narrow("train", *run_sets(write_corpus(tmp_path)), "--out", run)
    assert result.exit_code == 0, result.output
    assert f"run: {run}" in result.stdout.splitlines(), result.stdout


def test_prepare_prints_its_out_path_on_one_line_at_60_columns(tmp_path):
    out = tmp_path / LONG / "data"
    result = _narrow("prepare", write_corpus(tmp_path), "--out", out)
    assert result.exit_code == 0, result.output
    assert any(line.split() == ["out", str(out)] for line in result.stdout.splitlines()), result.stdout


def test_train_help_says_the_default_run_from_the_config_defaults():
    m, t = RunConfig().model, RunConfig().train
    said = flat(invoke("train", "--help").stdout)
    assert (f"the 2017 end ({m.norm_type} {m.norm_pos}-norm, {m.pos_type} positions, {m.ffn_type}; {m.n_head} heads, "
            f"{m.n_kv_head} K/V heads) at d_model {m.d_model}, {m.n_layer} layers, ctx_len {m.ctx_len}, batch "
            f"{t.batch_size}, {t.steps} steps, on the embedded corpus") in said, said


def test_the_readme_train_line_says_the_default_run():
    m, t = RunConfig().model, RunConfig().train
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if re.match(r"anatomy train\s+#", line))
    assert line.split("#", 1)[1].strip() == (f"the 2017 end, d_model {m.d_model}, {m.n_layer} layers, ctx {m.ctx_len}, "
                                             f"batch {t.batch_size}, {t.steps} steps")


def _run(sweep: Path, rid: str, status: str, **summary) -> None:
    """A run folder of the demo sweep: an empty config and a summary of that status."""
    (sweep / rid).mkdir(parents=True)
    (sweep / rid / runs.CONFIG).write_text("{}")
    (sweep / rid / runs.SUMMARY).write_text(json.dumps({"status": status, "sweep": "demo", **summary}))


def _sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "runs" / "demo"
    for rid, status in (("2017-s1337-aaaa", runs.FAILED), ("2017-s1338-bbbb", runs.COMPLETED)):
        _run(sweep, rid, status)
    (sweep / runs.SWEEP).write_text(json.dumps({"components": []}))
    return sweep


def test_sample_on_a_sweep_folder_names_one_of_its_runs(tmp_path):
    sweep = _sweep(tmp_path)
    one_error_line(invoke("sample", sweep),
                   f"{sweep} is a sweep folder: pass one of its runs, e.g. {sweep / '2017-s1338-bbbb'}")


def test_sample_on_an_empty_sweep_folder_says_where_a_run_goes(tmp_path):
    sweep = tmp_path / "runs" / "demo"
    sweep.mkdir(parents=True)
    (sweep / runs.SWEEP).write_text(json.dumps({"components": []}))
    one_error_line(invoke("sample", sweep), f"{sweep} is a sweep folder: pass one of its runs, e.g. {sweep}/<a run id>")


def _llama_sweep(tmp_path: Path) -> Path:
    """The demo's folder in small: a completed 2017-end run first by name, a failed and a completed LLaMA-end run."""
    sweep = _sweep(tmp_path)
    for rid, status in (("llama-s1337-cccc", runs.FAILED), ("llama-s1338-dddd", runs.COMPLETED)):
        _run(sweep, rid, status, role="all-on")
    return sweep


def test_sample_on_a_sweep_folder_suggests_a_completed_llama_end_run(tmp_path):
    sweep = _llama_sweep(tmp_path)
    one_error_line(invoke("sample", sweep),
                   f"{sweep} is a sweep folder: pass one of its runs, e.g. {sweep / 'llama-s1338-dddd'}")


def test_sample_takes_a_unique_prefix_of_a_run_id(tmp_path):
    sweep = _llama_sweep(tmp_path)
    # the one run it names is read: its config.json ({}) is not a run's, and the error says which folder it read
    # the one run it names is read (its vocab.json, missing here: the error names the run's full folder)
    one_error_line(invoke("sample", sweep / "llama-s1338"), f"{sweep / 'llama-s1338-dddd' / 'vocab.json'}")
    assert runs.by_prefix(sweep / "llama-s1338") == sweep / "llama-s1338-dddd"
    assert runs.by_prefix(sweep / "nothing") == sweep / "nothing"  # no match: the caller says not found
    one_error_line(invoke("sample", sweep / "nothing"), f"run directory not found: {sweep / 'nothing'}")


def test_an_ambiguous_prefix_is_one_line_listing_its_runs(tmp_path):
    sweep = _llama_sweep(tmp_path)
    one_error_line(invoke("sample", sweep / "llama"),
                   f"{sweep / 'llama'} is a prefix of 2 runs: llama-s1337-cccc, llama-s1338-dddd; give more of the "
                   f"run id")


CAL = {"step_s": 0.5, "eval_s": 2.0, "run_s": 3.0, "startup_s": 4.0, "when": "2024-01-01 00:00:00"}


def test_train_says_its_estimate_before_its_first_step(tmp_path, monkeypatch):
    from helpers import fake_calibration

    measured = fake_calibration(tmp_path, monkeypatch, CAL)  # this machine's step times, "measured" as CAL
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", *run_sets(write_corpus(tmp_path)), "--steps", "30", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert measured == [1]  # one shape measured, as a plan measures it
    evals = 30 // 6 + 1  # TINY_TRAIN's eval_interval 6: steps 0, 6, ..., 30
    seconds = CAL["run_s"] + 30 * CAL["step_s"] + evals * CAL["eval_s"] + CAL["startup_s"]
    said = flat(result.stderr)
    assert f"est. {seconds:.0f}s for 30 steps, from step times measured on this machine" in said, said
    assert said.index("est. ") < said.index("train ")  # before the progress bar's first step


def test_the_eta_stays_on_a_fake_clock():
    from anatomy_cli.cli.run import train_progress

    now = [0.0]
    bar = train_progress(get_time=lambda: now[0])
    task = bar.add_task("train", total=100, losses="", estimate=50.0)
    shown = lambda: bar.columns[-1].render(bar.tasks[0]).plain  # noqa: E731
    assert shown() == "eta 0:00:50"  # before the first step: the estimate
    now[0] = 60.0
    bar.update(task, completed=10)
    assert shown() == "eta 0:09:00"  # 6 s a step so far, 90 steps left
    now[0] = 600.0  # no step for minutes (rich's own column goes blank: -:--:--)
    assert shown() == "eta 1:30:00" and "-:--" not in shown()
    bar.update(task, completed=100)
    assert shown() == "eta 0:00:00"
    bare = train_progress(get_time=lambda: 0.0)
    bare.add_task("train", total=10, losses="", estimate=None)
    assert bare.columns[-1].render(bare.tasks[0]).plain == "eta ?"


def test_the_summary_prints_rates_and_seconds_at_a_sensible_precision():
    from anatomy_cli.cli.run import summary_value

    assert summary_value("tokens_per_s", 1439.8211) == "1,440"  # not 1,439.8211
    assert summary_value("wall_s", 612.3456) == "612.3"
    assert summary_value("best_val_loss", 2.123456) == "2.1235" and summary_value("params", 966144) == "966,144"
    assert summary_value("device", "cpu") == "cpu"
