"""Periodic checkpoints: when they are written, that a kill at any instant of writing one leaves a
loadable one, and that a run resumed from any of them ends with the metrics, best weights and
summary of a run trained straight through (bit for bit on CPU)."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from toy_data import TINY_MODEL, TINY_TRAIN, write_corpus

from anatomy_cli.data.load import load_corpus
from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import runs
from anatomy_cli.training import checkpoint
from anatomy_cli.training import tensorboard as tb_events
from anatomy_cli.training.run import resume, train
from anatomy_cli.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("single_thread")


def cfg_for(corpus, **train_kw) -> RunConfig:
    return validate(RunConfig, {"model": TINY_MODEL, "train": {**TINY_TRAIN, "sample_len": 0, "eval_interval": 3,
                                                                "log_interval": 2, **train_kw},
                                "data": {"source": str(corpus)}})


def strip(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(run_dir)]


def same_weights(a, b) -> bool:
    wa, wb = load_file(str(a)), load_file(str(b))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, corpus):
    run = tmp_path_factory.mktemp("straight") / "run"
    torch.set_num_threads(1)
    assert train(cfg_for(corpus), run)["status"] == runs.COMPLETED
    return run


def checkpoint_steps(monkeypatch) -> list[int]:
    steps: list[int] = []
    real = Trainer.checkpoint

    def spy(self):
        steps.append(self.step)
        real(self)

    monkeypatch.setattr(Trainer, "checkpoint", spy)
    return steps


@pytest.mark.parametrize("opts, expected", [
    ({}, [3, 6, 9]),  # every evaluation; step 12 ends the run
    ({"checkpoint_every": 5}, [5, 10]),
    ({"checkpoint_every": 5, "checkpoint_minutes": 1e3}, [5, 10]),
    ({"checkpoint_minutes": 1e-9}, list(range(1, 12))),  # due after every step
    ({"checkpoint_every": 100}, []),
], ids=["default", "every-5", "every-5-or-hours", "minutes", "never"])
def test_checkpoints_are_written_when_due_and_change_nothing(tmp_path, corpus, straight, monkeypatch, opts, expected):
    steps = checkpoint_steps(monkeypatch)
    summary = train(cfg_for(corpus, **opts), tmp_path / "run")
    assert steps == expected
    assert strip(tmp_path / "run") == strip(straight)
    assert summary["best_val_loss"] == runs.read_summary(straight)["best_val_loss"]
    assert not (tmp_path / "run" / runs.RESUME).exists()  # a finished run keeps last + best only
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith(tb_events.PREFIX)) == sorted(
        [runs.CONFIG, runs.METRICS, runs.VOCAB, runs.BEST, runs.LAST, runs.SUMMARY])


def test_checkpoint_fields_stay_out_of_the_run_id_at_any_value(corpus):
    """They never change a run's results, so they never change its id: an older run (without them)
    keeps its id, and a rerun with another interval skips finished runs instead of retraining them."""
    config = cfg_for(corpus).model_dump(mode="json")
    old = {**config, "train": {k: v for k, v in config["train"].items() if not k.startswith("checkpoint_")}}
    for every, minutes in ((None, None), (7, None), (None, 2.5), (1, 0.1)):
        new = {**config, "train": {**config["train"], "checkpoint_every": every, "checkpoint_minutes": minutes}}
        assert runs.config_hash(new) == runs.config_hash(old)
    other = {**config, "train": {**config["train"], "steps": 13}}
    assert runs.config_hash(other) != runs.config_hash(old)


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs (no `except Exception` catches it)."""


def kill_at(monkeypatch, obj, name: str, nth: int, match=lambda *a: True, before=None, after=False):
    """Make obj.name raise Killed on its nth matching call: before(real, *args) first (a torn write),
    or after the real call completed (after=True)."""
    real, calls = getattr(obj, name), []

    def fake(*args, **kwargs):
        if match(*args):
            calls.append(args)
            if len(calls) == nth:
                if after:
                    real(*args, **kwargs)
                elif before:
                    before(real, *args, **kwargs)
                raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, fake)


def torn(real, obj, path, *args, **kwargs):
    """Write the file, then cut it in half: what a kill mid-write leaves in the temp file."""
    real(obj, path, *args, **kwargs)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def is_resume(src, dst) -> bool:
    return str(dst).endswith(runs.RESUME)


# The writes of a checkpoint at step 6 (eval_interval 3: a checkpoint at 3 exists): its val loss
# improved, so best.safetensors is written at the eval, the metric lines are flushed, then resume.pt.
# With checkpoint_every 5 (log_interval 2) a checkpoint falls between two flushes of metric lines.
KILLS = {
    "torn-resume-temp": (lambda mp: kill_at(mp, torch, "save", 2, before=torn), {}, 3),
    "before-rename": (lambda mp: kill_at(mp, os, "replace", 2, match=is_resume), {}, 3),
    "after-rename": (lambda mp: kill_at(mp, os, "replace", 2, match=is_resume, after=True), {}, 6),
    "torn-best-weights": (lambda mp: kill_at(mp, checkpoint, "save_file", 3, before=torn), {}, 3),
    "after-best-weights": (lambda mp: kill_at(mp, checkpoint, "save_file", 3, after=True), {}, 3),
    "mid-interval": (lambda mp: kill_at(mp, os, "replace", 2, match=is_resume), {"checkpoint_every": 5}, 5),
    "after-mid-interval": (lambda mp: kill_at(mp, os, "replace", 1, match=is_resume, after=True),
                           {"checkpoint_every": 5}, 5),
}


@pytest.mark.parametrize("kill", KILLS)
def test_a_kill_inside_a_checkpoint_write_leaves_a_loadable_one(tmp_path, corpus, straight, monkeypatch, kill):
    inject, opts, step = KILLS[kill]
    run = tmp_path / "run"
    with monkeypatch.context() as mp:
        inject(mp)
        with pytest.raises(Killed):
            train(cfg_for(corpus, **opts), run)
    assert runs.run_status(run) == runs.INTERRUPTED
    assert checkpoint.load_checkpoint(run / runs.RESUME)["step"] == step  # the last complete one
    (run / f".{runs.RESUME}.k1ll3d.tmp").write_bytes(b"torn")  # what a real SIGKILL leaves (no cleanup runs)
    summary = resume(run)
    assert summary["status"] == runs.COMPLETED and summary["steps_done"] == TINY_TRAIN["steps"]
    assert strip(run) == strip(straight)
    assert summary["best_step"] == runs.read_summary(straight)["best_step"]
    assert same_weights(run / runs.BEST, straight / runs.BEST) and same_weights(run / runs.LAST, straight / runs.LAST)
    assert not list(run.glob(".*.tmp"))  # the torn temp file is gone, as are ours


def test_resume_puts_back_the_best_weights_of_its_checkpoint(tmp_path, corpus, straight):
    """best.safetensors written after the checkpoint (by a run killed later) is not the checkpoint's
    best: resume restores the one the checkpoint's best_step names."""
    run = tmp_path / "run"
    seen = {"step": 0}
    cfg = cfg_for(corpus, checkpoint_every=4)
    train(cfg, run, progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 4)
    state = checkpoint.load_checkpoint(run / runs.RESUME)
    assert state["step"] == 4 and state["best_step"] == 3 and state["best_model"] is not None
    checkpoint.save_weights({k: v + 1 for k, v in state["model"].items()}, run / runs.BEST)  # "a later best"
    tr = Trainer(checkpoint.load_run_config(run), run, load_corpus(str(corpus), 0.1, cfg.model.ctx_len))
    tr.restore()
    best = load_file(str(run / runs.BEST))
    assert all(torch.equal(best[k], v) for k, v in state["best_model"].items())
    assert (tr.step, tr.log.best_step, tr.log.best) == (4, 3, state["best"])
    runs.atomic_write_json(run / runs.SUMMARY, {**runs.read_summary(run), "status": runs.RUNNING, "owner": None})
    resume(run)
    assert strip(run) == strip(straight) and same_weights(run / runs.BEST, straight / runs.BEST)


def test_a_resume_state_of_an_older_version_still_resumes(tmp_path, corpus, straight):
    """Before checkpoints held everything, resume.pt had positional counters and the weights were in
    last.safetensors."""
    run = tmp_path / "run"
    seen = {"step": 0}
    train(cfg_for(corpus), run, progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 4)
    s = checkpoint.load_checkpoint(run / runs.RESUME)
    checkpoint.save_weights(s["model"], run / runs.LAST)
    old = {"optimizer": s["optimizer"], "sampler": s["sampler"], "torch_rng": s["torch_rng"],
           "counters": torch.tensor([s["step"], s["best_step"]]),
           "floats": torch.tensor([s["best"], s["ref_loss"], s["last_val"], s["elapsed"], s["train_time"]],
                                  dtype=torch.float64)}
    torch.save(old, run / runs.RESUME)
    assert resume(run)["status"] == runs.COMPLETED
    assert strip(run) == strip(straight)


def test_a_checkpoint_that_does_not_fit_the_run_is_one_line_and_leaves_the_run(tmp_path, corpus):
    run = tmp_path / "run"
    seen = {"step": 0}
    train(cfg_for(corpus), run, progress=lambda p: seen.update(step=p["step"]), stop=lambda: seen["step"] >= 4)
    files = lambda: {p.name: p.read_bytes() for p in run.iterdir() if p.name in runs.RUN_FILES}  # noqa: E731
    before = files()
    state = checkpoint.load_checkpoint(run / runs.RESUME)
    del state["model"]["tok.weight"]
    checkpoint.save_checkpoint(state, run / runs.RESUME)
    with pytest.raises(runs.RunError, match="does not fit this run: .*tok.weight"):
        resume(run)
    assert runs.run_status(run) == runs.INTERRUPTED
    after = files()
    assert after.keys() == before.keys() and all(after[k] == before[k] for k in before if k != runs.RESUME)
