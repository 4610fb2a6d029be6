"""Decays branched from a run's stable phase (training/branch.py): a branch equals the run trained to its
budget from step 0 (every metric line, the best and last weights), also when killed and resumed; the
parent keeps its checkpoints (alone and stacked); what cannot branch is refused in one line. Toy sizes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from toy_data import TINY_MODEL, write_corpus

from anatomy_cli.spec.config import RunConfig, validate
from anatomy_cli.store import lockfile, runs
from anatomy_cli.training.branch import branch
from anatomy_cli.training.budgets import branch_config, budget_ladder
from anatomy_cli.training.checkpoint import read_weights
from anatomy_cli.training.run import resume, train
from anatomy_cli.training.stacked import train_group

# 20 steps, a 25 % decay (steps 15..19); the 12-step budget decays over its last 3 (9..11)
TRAIN = {"steps": 20, "batch_size": 4, "eval_interval": 3, "eval_batches": 2, "log_interval": 1, "warmup": 2,
         "lr": 3e-3, "schedule": "wsd", "decay_frac": 0.25, "sample_len": 0}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def base(corpus: Path, seed: int = 1337, **train_kw) -> RunConfig:
    return validate(RunConfig, {"seed": seed, "model": TINY_MODEL, "train": {**TRAIN, **train_kw},
                                "data": {"source": str(corpus)}})


@pytest.fixture(scope="module")
def ladder(corpus):
    return budget_ladder(base(corpus), [12, 20])


@pytest.fixture(scope="module")
def parent(tmp_path_factory, ladder) -> Path:
    """The stable run: 20 steps, keeping its checkpoint at step 9 (the 12-step budget's decay start)."""
    run = tmp_path_factory.mktemp("parent") / "run"
    assert ladder.stable.config.train.keep_checkpoints == (9,)
    assert train(ladder.stable.config, run)["status"] == runs.COMPLETED
    return run


@pytest.fixture(scope="module")
def straight(tmp_path_factory, ladder) -> Path:
    """The 12-step budget trained from step 0."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert train(ladder.runs[1].config, run)["status"] == runs.COMPLETED
    return run


def strip(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(run_dir)]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = read_weights(a), read_weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_parent_keeps_its_checkpoint_at_each_branch_step_past_its_end(parent):
    assert runs.kept_checkpoints(parent) == [runs.kept_checkpoint(parent, 9)]
    assert not (parent / runs.RESUME).exists()  # the run's own resume state goes when it completes


def test_a_branch_equals_the_run_trained_to_its_budget_from_step_0(tmp_path, parent, straight, ladder):
    summary = branch(parent, ladder.runs[1].config, tmp_path / "b")
    assert summary["status"] == runs.COMPLETED and summary["steps_done"] == 12
    assert summary["branched_from"] == {"run": str(parent), "run_id": parent.name, "step": 9}
    assert strip(tmp_path / "b") == strip(straight)  # every line: losses, grad norms, lr, tokens
    assert same_weights(tmp_path / "b" / runs.BEST, straight / runs.BEST)
    assert same_weights(tmp_path / "b" / runs.LAST, straight / runs.LAST)
    assert summary["best_val_loss"] == runs.read_summary(straight)["best_val_loss"]
    assert branch(parent, ladder.runs[1].config, tmp_path / "b") == runs.read_summary(tmp_path / "b")  # done: kept


def dead_owner() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return lockfile.identity(proc.pid) | {"start": None}


@pytest.mark.process
def test_a_branch_killed_and_resumed_equals_an_uninterrupted_one(tmp_path, parent, straight, ladder):
    seen = {"step": 0}
    run = tmp_path / "b"
    stopped = branch(parent, ladder.runs[1].config, run, progress=lambda p: seen.update(step=p["step"]),
                     stop=lambda: seen["step"] >= 10)
    assert stopped["status"] == runs.INTERRUPTED and stopped["branched_from"]["step"] == 9
    # resumed, then killed at step 11: summary 'running' with a dead owner, metric lines past the checkpoint
    runs.atomic_write_json(run / runs.SUMMARY, {**runs.read_summary(run), "status": runs.RUNNING,
                                                "owner": dead_owner()})
    with open(run / runs.METRICS, "a") as f:
        f.write(runs.json_line({"step": 11, "train_loss": 9.0}))
    assert runs.run_status(run) == runs.INTERRUPTED
    done = resume(run)
    assert done["status"] == runs.COMPLETED and done["branched_from"]["step"] == 9 and done["resumed_at"] == [10]
    assert strip(run) == strip(straight)
    assert same_weights(run / runs.LAST, straight / runs.LAST)


def test_a_branch_killed_before_it_started_training_is_set_up_again(tmp_path, parent, straight, ladder):
    run = tmp_path / "b"
    run.mkdir()
    (run / runs.CONFIG).write_text("{}")  # a kill during setup: a config, no summary
    assert branch(parent, ladder.runs[1].config, run)["status"] == runs.COMPLETED
    assert strip(run) == strip(straight)


def test_what_cannot_branch_is_refused_in_one_line(tmp_path, corpus, parent, ladder):
    other_lr = branch_config(base(corpus, lr=1e-3), 12)
    with pytest.raises(runs.RunError, match="differs from the parent in train.lr") as err:
        branch(parent, other_lr, tmp_path / "a")
    assert "\n" not in str(err.value)
    with pytest.raises(runs.RunError, match="no kept checkpoint at step 6"):
        branch(parent, branch_config(base(corpus), 8), tmp_path / "b")  # 8 steps decay from 6: not kept
    longer = branch_config(base(corpus, steps=40), 40)  # decays from 30, after the parent's decay began at 15
    with pytest.raises(runs.RunError, match="not inside both stable phases"):
        branch(parent, longer, tmp_path / "c")
    with pytest.raises(runs.RunError, match="seed"):
        branch(parent, branch_config(base(corpus, seed=7), 12), tmp_path / "d")
    assert not any((tmp_path / name).exists() for name in "abcd")  # nothing written


def test_a_parent_whose_lines_do_not_reach_the_step_yet_is_refused(tmp_path, parent, ladder):
    again = tmp_path / "parent"
    shutil.copytree(parent, again)  # as when it is resumed from a checkpoint before the step, its lines dropped
    rows = [r for r in runs.read_metrics(again) if r["step"] <= 6]
    runs.atomic_write_text(again / runs.METRICS, "".join(runs.json_line(r) for r in rows))
    with pytest.raises(runs.RunError, match="does not reach step 9 yet"):
        branch(again, ladder.runs[1].config, tmp_path / "b")
    assert not (tmp_path / "b").exists()


@pytest.mark.process
def test_stacked_members_keep_their_checkpoints_too(tmp_path, corpus):
    cfgs = [budget_ladder(base(corpus, seed=s, steps=8), [4, 8]).stable.config for s in (1, 2)]
    assert cfgs[0].train.keep_checkpoints == (3,)
    dirs = [tmp_path / "s1", tmp_path / "s2"]
    train_group(cfgs, dirs)
    assert all(runs.kept_checkpoints(d) == [runs.kept_checkpoint(d, 3)] for d in dirs)
