"""TensorBoard event files: written by training, back-filled by `anatomy report --tensorboard`,
read back with tensorboard's own event reader (skipped without the tb extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.store import runs
from anatomy_cli.training import tensorboard as tb_events

SCALARS = {"loss/train", "loss/val", "grad_norm", "lr", "tokens_per_s"}


def read_events(run_dir: Path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(run_dir).glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(str(files[0]), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def write_run(root: Path, name: str = "run") -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / runs.CONFIG).write_text(json.dumps({"name": name, "seed": 1, "model": {"d_model": 32}}))
    rows = [{"step": s, "train_loss": 3.0 - 0.1 * s, "grad_norm": 1.0 + s, "lr": 1e-3 * s, "tokens": 64 * s}
            for s in range(1, 7)]
    rows[2] |= {"val_loss": 2.8, "elapsed_s": 1.0}
    rows[5] |= {"val_loss": 2.5, "elapsed_s": 2.5}
    (run / runs.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_backfill_is_readable_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    run = write_run(tmp_path / "sweep")
    assert tb_events.backfill(tmp_path) == {"written": 1, "skipped": 0}
    acc = read_events(run)
    assert set(acc.Tags()["scalars"]) == SCALARS and "config" in acc.Tags()["tensors"]
    assert [e.value for e in acc.Scalars("loss/val")] == pytest.approx([2.8, 2.5])
    assert [e.step for e in acc.Scalars("loss/train")] == [1, 2, 3, 4, 5, 6]
    assert [(e.step, e.value) for e in acc.Scalars("tokens_per_s")] == [(6, pytest.approx(192 / 1.5))]
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert '"d_model": 32' in text
    assert tb_events.backfill(tmp_path) == {"written": 1, "skipped": 0}  # rewritten, still one file
    assert len(list(run.glob("events.out.tfevents.*"))) == 1


def test_training_writes_events(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from anatomy_cli.spec.config import RunConfig
    from anatomy_cli.training.run import train

    corpus = write_corpus(tmp_path)
    cfg = RunConfig.model_validate({"model": TINY_MODEL, "train": {**TINY_TRAIN, "sample_len": 0},
                                    "data": {"source": str(corpus)}})
    run = tmp_path / "run"
    train(cfg, run)
    acc = read_events(run)
    assert set(acc.Tags()["scalars"]) == SCALARS
    metrics = runs.read_metrics(run)
    assert [e.value for e in acc.Scalars("loss/val")] == pytest.approx([m["val_loss"] for m in metrics
                                                                        if "val_loss" in m])
    assert len(acc.Scalars("loss/train")) == TINY_TRAIN["steps"]
    assert tb_events.backfill(tmp_path) == {"written": 0, "skipped": 1}  # training wrote its own
    train(cfg, run)  # a rerun from scratch leaves one event file, not two
    assert len(list(run.glob("events.out.tfevents.*"))) == 1


def test_without_tensorboard(tmp_path, monkeypatch):
    monkeypatch.setattr(tb_events, "available", lambda: False)
    assert tb_events.for_run(tmp_path, {}) is None
    write_run(tmp_path / "sweep")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--tensorboard"])
    assert result.exit_code == 2 and "anatomy-cli[tb]" in result.output
    assert len(result.output.strip().splitlines()) == 1
