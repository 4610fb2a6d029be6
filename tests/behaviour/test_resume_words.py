"""What a resume leaves and says (issue #30): TensorBoard events with each logged step once after a
kill, the step it continues from (a note and the summary's resumed_at), and a relative data.source
read from the folder the run started in."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training.run import resume, train


def cfg_for(source: str) -> RunConfig:
    return validate(RunConfig, {"model": TINY_MODEL, "train": {**TINY_TRAIN, "sample_len": 0, "log_interval": 1},
                                "data": {"source": source}})


def stop_at(step: int):
    seen = {"step": 0}

    def progress(p):
        seen["step"] = p["step"]

    return progress, (lambda: seen["step"] >= step)


def interrupted(run: Path, source: str, at: int = 4) -> Path:
    progress, stop = stop_at(at)
    assert train(cfg_for(source), run, progress=progress, stop=stop)["status"] == runs.INTERRUPTED
    return run


def event_steps(run_dir: Path) -> dict[str, Counter]:
    """{tag: Counter of steps} over every event file in the folder, as TensorBoard reads them all."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, Counter] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                out.setdefault(value.tag, Counter())[event.step] += 1
    return out


def test_a_killed_run_resumed_has_each_logged_step_once_in_its_events(tmp_path):
    pytest.importorskip("tensorboard")
    corpus = write_corpus(tmp_path)
    run = interrupted(tmp_path / "run", str(corpus), at=4)
    kept = (run / runs.RESUME).read_bytes()  # the checkpoint at step 4
    progress, stop = stop_at(8)
    assert resume(run, progress=progress, stop=stop)["status"] == runs.INTERRUPTED
    # killed at step 8 with its checkpoint still at step 4: events (and metric lines) for 5..8 written
    (run / runs.RESUME).write_bytes(kept)
    assert resume(run)["status"] == runs.COMPLETED
    metrics = runs.read_metrics(run)
    steps = event_steps(run)
    train_steps = [m["step"] for m in metrics if "train_loss" in m]
    val_steps = [m["step"] for m in metrics if "val_loss" in m]
    assert train_steps == list(range(1, TINY_TRAIN["steps"] + 1))
    assert steps["loss/train"] == Counter(train_steps)  # each once: no duplicates, none missing
    assert steps["loss/val"] == Counter(val_steps)
    assert steps["config"] == Counter({0: 1})


def test_resume_says_and_records_the_step_it_continues_from(tmp_path):
    corpus = write_corpus(tmp_path)
    run = interrupted(tmp_path / "run", str(corpus), at=4)
    lines: list[str] = []
    progress, stop = stop_at(8)
    summary = resume(run, progress=progress, stop=stop, note=lines.append)
    assert summary["status"] == runs.INTERRUPTED and summary["resumed_at"] == [4]
    assert len(lines) == 1 and lines[0].startswith("resuming run at step 4 of 12 (checkpoint written 20")
    summary = resume(run, note=lines.append)
    assert summary["status"] == runs.COMPLETED and summary["resumed_at"] == [4, 8]
    assert lines[1].startswith("resuming run at step 8 of 12")
    assert "resumed_at" not in train(cfg_for(str(corpus)), tmp_path / "fresh")  # only a resumed run has it


def test_the_cli_prints_the_resume_line(tmp_path):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    corpus = write_corpus(tmp_path)
    run = interrupted(tmp_path / "run", str(corpus), at=4)
    result = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert result.exit_code == 0, result.output
    assert "resuming run at step 4 of 12 (checkpoint written" in " ".join(result.output.split())


def test_a_relative_source_is_read_from_the_folder_the_run_started_in(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_corpus(a)
    monkeypatch.chdir(a)
    run = interrupted(tmp_path / "run", "tiny.txt", at=4)
    assert runs.read_json(run / runs.CONFIG)["data"]["source"] == "tiny.txt"  # as given: the run id hashes it
    monkeypatch.chdir(b)  # no tiny.txt here
    summary = resume(run)
    assert summary["status"] == runs.COMPLETED and summary["started_in"] == str(a)
