"""Run directories under hostile use: replacing a finished run, training into a sweep, resuming on
another corpus, resuming a killed run, two trainers on one run, a failure mid-run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import invoke, one_error_line
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus
from typer.testing import CliRunner

from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import lockfile, runs
from anatomy_cli.training.run import resume, train

runner = CliRunner()


def cfg_for(corpus: Path, **train_kw) -> RunConfig:
    return validate(RunConfig, {"model": TINY_MODEL, "train": {**TINY_TRAIN, "sample_len": 0, **train_kw},
                                "data": {"source": str(corpus)}})


def stop_at(step: int):
    """A stop callable that asks the loop to stop once `step` steps are done (read from progress)."""
    seen = {"step": 0}

    def progress(p):
        seen["step"] = p["step"]

    return progress, (lambda: seen["step"] >= step)


def strip(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(run_dir)]


def sets_for(corpus: Path) -> list[str]:
    sets = [f"--set=data.source={json.dumps(str(corpus))}"]
    sets += [f"--set=model.{k}={json.dumps(v)}" for k, v in TINY_MODEL.items()]
    sets += [f"--set=train.{k}={json.dumps(v)}" for k, v in {**TINY_TRAIN, "sample_len": 0}.items()]
    return sets


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, corpus) -> Path:
    """The reference: the toy run trained through without a stop."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert train(cfg_for(corpus, log_interval=1), run)["status"] == runs.COMPLETED
    return run


def interrupted(tmp_path: Path, corpus: Path, at: int = 4) -> Path:
    run = tmp_path / "run"
    progress, stop = stop_at(at)
    summary = train(cfg_for(corpus, log_interval=1), run, progress=progress, stop=stop)
    assert summary["status"] == runs.INTERRUPTED and (run / runs.RESUME).is_file()
    return run


def dead_owner() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return lockfile.identity(proc.pid) | {"start": None}


# ------------------------------------------------------------------------------ --out over a run


def test_train_refuses_to_replace_a_finished_run_unless_overwrite(tmp_path, corpus, straight):
    run = shutil.copytree(straight, tmp_path / "done")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    result = invoke("train", *sets_for(corpus), "--set=seed=7", "--out", run)
    one_error_line(result, f"{run} already holds a completed run; pass --overwrite to replace it")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # untouched
    result = invoke("train", *sets_for(corpus), "--set=seed=7", "--out", run, "--overwrite")
    assert result.exit_code == 0, result.output
    assert json.loads((run / runs.CONFIG).read_text())["seed"] == 7


def test_train_refuses_a_sweep_directory_even_with_overwrite(tmp_path, corpus, straight):
    sweep = tmp_path / "sweep"
    shutil.copytree(straight, sweep / "some-run-s0-abcd1234")
    (sweep / ".lock").write_text("")
    for extra in ([], ["--overwrite"]):
        result = invoke("train", *sets_for(corpus), "--out", sweep, *extra)
        one_error_line(result, "holds other runs (a sweep or runs directory)")
    assert sorted(p.name for p in sweep.iterdir()) == [".lock", "some-run-s0-abcd1234"]


def test_train_refuses_a_non_empty_folder_and_names_resume_for_an_interrupted_run(tmp_path, corpus):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    one_error_line(invoke("train", *sets_for(corpus), "--out", other), "is not empty; pass --overwrite")
    run = interrupted(tmp_path, corpus)
    one_error_line(invoke("train", *sets_for(corpus), "--out", run),
                   f"already holds a interrupted run; pass --overwrite to replace it or resume it with --resume {run}")


# ------------------------------------------------------------------------------ corpus fingerprint


def test_resume_refuses_a_changed_corpus_with_the_same_vocabulary(tmp_path):
    corpus = write_corpus(tmp_path)
    run = interrupted(tmp_path, corpus)
    assert runs.read_summary(run)["corpus_sha256"] == __import__("hashlib").sha256(corpus.read_bytes()).hexdigest()
    text = corpus.read_text()
    corpus.write_text(text[len(text) // 2:] + "\n" + text[: len(text) // 2])  # same characters, other order
    one_error_line(invoke("train", "--resume", run), "the corpus changed since the run started (sha256")
    assert runs.run_status(run) == runs.INTERRUPTED  # still resumable once the corpus is back
    corpus.write_text(text)
    assert invoke("train", "--resume", run).exit_code == 0


# ------------------------------------------------------------------------------ killed runs


@pytest.mark.process
def test_a_killed_run_resumes_from_its_checkpoint_dropping_metrics_past_it(tmp_path, corpus, straight):
    run = interrupted(tmp_path, corpus, at=4)
    # resumed, then killed at step 9: summary still 'running' (dead owner), metrics written past step 4
    runs.atomic_write_json(run / runs.SUMMARY,
                           {**runs.read_summary(run), "status": runs.RUNNING, "owner": dead_owner()})
    with open(run / runs.METRICS, "a") as f:
        f.write("".join(runs.json_line({"step": s, "train_loss": 9.0}) for s in range(5, 10)))
    assert runs.run_status(run) == runs.INTERRUPTED
    assert resume(run)["status"] == runs.COMPLETED
    assert strip(run) == strip(straight)


@pytest.mark.process
def test_a_run_killed_before_any_checkpoint_trains_again_from_step_0(tmp_path, corpus, straight):
    run = interrupted(tmp_path, corpus)
    (run / runs.RESUME).unlink()
    runs.atomic_write_json(run / runs.SUMMARY, {"status": runs.RUNNING, "owner": dead_owner(), "sweep": "s"})
    summary = resume(run)
    assert summary["status"] == runs.COMPLETED and summary["sweep"] == "s"
    assert strip(run) == strip(straight)


def test_a_running_run_with_a_live_owner_cannot_be_resumed_or_replaced(tmp_path, corpus):
    run = interrupted(tmp_path, corpus)
    with runs.RunLock(run):  # this process plays a live trainer of the run
        one_error_line(invoke("train", "--resume", run), f"run directory {run} is in use by pid", code=3)
        one_error_line(invoke("train", *sets_for(corpus), "--out", run, "--overwrite"), "is in use by pid", code=3)
    runs.atomic_write_json(run / runs.SUMMARY, {"status": runs.RUNNING, "owner": lockfile.identity()})
    assert runs.run_status(run) == runs.RUNNING
    one_error_line(invoke("train", "--resume", run), "is running; only interrupted runs can be resumed")


# ------------------------------------------------------------------------------ failures mid-run


def test_an_exception_mid_run_leaves_the_run_failed_with_its_error(tmp_path, corpus, monkeypatch):
    from anatomy_cli.training import run as training

    real = training.Trainer.train_step

    def oom_at_step_3(self):
        if self.step == 3:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real(self)

    monkeypatch.setattr(training.Trainer, "train_step", oom_at_step_3)
    run = tmp_path / "run"
    result = invoke("train", *sets_for(corpus), "--out", run)
    assert result.exit_code == 1 and "out of memory" in result.output
    summary = runs.read_summary(run)
    assert summary["status"] == runs.FAILED
    assert summary["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert not (run / ".lock").exists()


def test_ablate_refuses_to_put_a_sweep_inside_a_run(tmp_path, corpus, straight):
    from toy_data import write_spec

    shutil.copytree(straight, tmp_path / "runs" / "toy")
    result = invoke("ablate", write_spec(tmp_path, corpus=corpus), "--runs-dir", tmp_path / "runs", "--no-report")
    one_error_line(result, "is a run directory, not a sweep directory")
    assert not list((tmp_path / "runs" / "toy").glob("*/"))
