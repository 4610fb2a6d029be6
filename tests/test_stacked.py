"""Stacked seeds (stacked.py): each member of a stack equals the run trained alone, writes the same
files, is masked when it diverges, and resumes; parts that cannot stack train alone and say why."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from toy_data import TINY_MODEL, write_corpus

from anatomy_cli import runs
from anatomy_cli.config import RunConfig, validate
from anatomy_cli.stacked import StackedTrainer, clip_members, stack_problem, train_group
from anatomy_cli.train import train

TRAIN = {"steps": 16, "batch_size": 4, "eval_interval": 8, "log_interval": 4, "eval_batches": 2, "warmup": 2,
         "lr": 3e-3, "sample_len": 12, "device": "cpu", "threads": 1}
LLAMA = {"norm_type": "rmsnorm", "norm_pos": "pre", "pos_type": "rope", "ffn_type": "swiglu", "n_kv_head": 2}
ENDS = {
    "2017": {},
    "llama": LLAMA,
    "mixed": {"norm_type": "rmsnorm", "pos_type": "rope"},
    "modern": {**LLAMA, "qk_norm": True, "tie_embeddings": True, "logit_softcap": 30.0, "parallel_block": True},
    "gdn": {**LLAMA, "gdn_pattern": "DA"},
}
TIMING = set(runs.TIMING_KEYS)


def cfgs(corpus: Path, seeds=(0, 1, 2), model: dict | None = None, **train_kw) -> list[RunConfig]:
    return [validate(RunConfig, {"seed": s, "model": {**TINY_MODEL, **(model or {})},
                                 "train": {**TRAIN, **train_kw}, "data": {"source": str(corpus)}}) for s in seeds]


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in runs.read_metrics(run_dir)]


def assert_close_runs(a: Path, b: Path, tol: float = 1e-4) -> None:
    ma, mb = metrics(a), metrics(b)
    assert [sorted(r) for r in ma] == [sorted(r) for r in mb]
    for ra, rb in zip(ma, mb):
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], abs=tol, rel=tol), (k, ra, rb)
    sa, sb = runs.read_summary(a), runs.read_summary(b)
    assert sa["status"] == sb["status"]
    assert abs(sa["best_val_loss"] - sb["best_val_loss"]) < tol
    assert sa["best_step"] == sb["best_step"] and sa["params"] == sb["params"]


def files(run_dir: Path) -> list[str]:
    """The run's file names, TensorBoard's (named by time and host) as one kind."""
    return sorted("events" if p.name.startswith("events.out") else p.name for p in run_dir.iterdir())


@pytest.mark.parametrize("end", list(ENDS))
def test_each_member_equals_its_run_alone(tmp_path, end):
    corpus = write_corpus(tmp_path)
    group = cfgs(corpus, model=ENDS[end])
    stacked = [tmp_path / "stack" / f"s{c.seed}" for c in group]
    summaries = train_group(group, stacked)
    assert [s["stacked"] for s in summaries] == [3, 3, 3]
    for c, d in zip(group, stacked):
        alone = tmp_path / "alone" / f"s{c.seed}"
        train(c, alone)
        assert_close_runs(d, alone)
        assert runs.read_summary(alone).get("stacked") is None
        # the same files as a lone run (no resume.pt once completed)
        assert files(d) == files(alone)
