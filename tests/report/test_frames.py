"""report/frames.py: run directories written by hand -> the runs frame and the long curves frame (no torch)."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
from report_runs import (
    make_run,
)
from toy_data import tiny_text

from anatomy_cli.report import frames
from anatomy_cli.spec.components import FIVE as FLIPS
from anatomy_cli.store.runs import RunError

pytestmark = pytest.mark.filterwarnings("error")  # the report must be warnings-free



def test_runs_frame_columns_and_values(tmp_path):
    make_run(tmp_path, "base", best=2.0, final=2.3, eval_ctx={"64": 2.1, "128": None})
    make_run(tmp_path, "llama", flips=FLIPS, best=1.8)
    make_run(tmp_path, "nosummary", flips=("rope",), summary=False)
    runs, curves = frames.load_runs(tmp_path)

    assert list(runs.columns) == frames.RUN_COLUMNS + ["val_loss_ctx_64", "val_loss_ctx_128"]
    assert len(runs) == 3
    base = runs.set_index("run_id").loc["base"]
    assert base["label"] == "2017" and not any(base[f] for f in FLIPS)
    assert base["overfit_gap"] == pytest.approx(0.3)
    assert base["val_loss_ctx_64"] == 2.1 and math.isnan(base["val_loss_ctx_128"])
    llama = runs.set_index("run_id").loc["llama"]
    assert llama["label"] == "llama" and all(llama[f] for f in FLIPS) and llama["n_kv_head"] == 1
    nosum = runs.set_index("run_id").loc["nosummary"]
    assert nosum["status"] == "incomplete" and nosum["label"] == "rope"
    assert nosum["best_val_loss"] == 2.0 and nosum["best_step"] == 4  # from metrics.jsonl
    assert pd.isna(nosum["params"])

    assert list(curves.columns) == ["run_id", "step", "tokens", "split", "loss", "bpb", "grad_norm"]
    assert set(curves["split"]) == {"train", "val"}
    assert len(curves) == 3 * (5 + 1)


def test_stability_columns(tmp_path):
    losses = [4.0, 3.0, 2.0, 3.5, 2.0, float("nan")]  # warmup=2: steps 2.. are checked
    metrics = [{"step": s, "train_loss": v, "grad_norm": g}
               for s, (v, g) in enumerate(zip(losses, [1, 9, 2, 50, 3, None]))]
    make_run(tmp_path, "spiky", metrics=metrics)
    runs, _ = frames.load_runs(tmp_path)
    # step 3: 3.5 > 1.5 x 2.0 (spike); step 5: NaN (spike); step 4: 2.0 (not).
    assert runs.loc[0, "loss_spikes"] == 2
    assert runs.loc[0, "max_grad_norm"] == 50.0


def test_count_loss_spikes_ignores_warmup():
    steps = np.arange(4)
    # A rise during warmup (step 1) does not count; after warmup it does.
    assert frames.count_loss_spikes(steps, [2.0, 4.0, 2.0, 3.1], warmup=2) == 1
    assert frames.count_loss_spikes(steps, [2.0, 4.0, 2.0, 3.1], warmup=0) == 2


def test_empty_metrics_and_failed_runs_tolerated(tmp_path):
    make_run(tmp_path, "empty", metrics=[], summary=False)
    make_run(tmp_path, "failed", status="failed", best=None)
    runs, curves = frames.load_runs(tmp_path)
    empty = runs.set_index("run_id").loc["empty"]
    assert empty["status"] == "incomplete" and empty["loss_spikes"] == 0
    assert math.isnan(empty["best_val_loss"]) and math.isnan(empty["max_grad_norm"])
    assert (curves["run_id"] != "empty").all()


def test_no_runs_raises_clearly(tmp_path):
    with pytest.raises(RunError, match="no runs under"):
        frames.load_runs(tmp_path)
    with pytest.raises(RunError, match="runs directory not found"):
        frames.load_runs(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match="not a directory"):
        frames.load_runs(tmp_path / "file")


def test_same_dir_name_in_two_sweeps_gets_a_path_id(tmp_path):
    make_run(tmp_path / "a", "base")
    make_run(tmp_path / "b", "base")
    make_run(tmp_path / "b", "rope", flips=("rope",))
    runs, curves = frames.load_runs(tmp_path)
    assert runs["run_id"].tolist() == ["a/base", "b/base", "rope"]
    assert set(curves["run_id"]) == {"a/base", "b/base", "rope"}


def test_a_killed_runs_running_summary_reads_as_interrupted(tmp_path):
    run = make_run(tmp_path, "killed", status="running")
    summary = json.loads((run / "summary.json").read_text())
    summary["owner"] = {"pid": 2**22 + 12345, "start": "1", "host": os.uname().nodename}  # no such process
    (run / "summary.json").write_text(json.dumps(summary))
    assert frames.load_runs(tmp_path)[0]["status"].tolist() == ["interrupted"]


def test_bits_per_byte_from_the_summary_else_counted_on_the_corpus(tmp_path):
    """A run's losses in bits per byte: its summary's val tokens and bytes where it records them, else its fixed
    val windows counted on its corpus as training counts them (an older run); unknown where the corpus is not the
    one it trained on. Its curves are turned by the same factor."""
    from anatomy_cli.data.batches import bits_per_byte, run_eval_counts
    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.spec.config import RunConfig, validate

    corpus = tmp_path / "mixed.txt"  # English and Chinese, as the embedded corpus: not a byte a character
    chinese = "训练一个小模型，看看每个部分值多少。"
    corpus.write_text("".join(f"{line}\n{chinese}\n" for line in tiny_text(4000).splitlines()), encoding="utf-8")
    cfg = validate(RunConfig, {"model": {"ctx_len": 16}, "train": {"batch_size": 2, "eval_batches": 3},
                               "data": {"source": str(corpus)}})
    loaded = load_corpus(str(corpus), 0.1, 16)
    tokens, size = run_eval_counts(loaded, cfg)
    assert size > 1.2 * tokens  # the windows hold multi-byte characters
    for name, extra in (("new", {"val_tokens": tokens, "val_bytes": size}), ("old", {})):
        run = make_run(tmp_path / "r", name, best=2.0)
        config = json.loads((run / "config.json").read_text())
        config["model"]["ctx_len"] = 16
        config["train"] |= {"batch_size": 2, "eval_batches": 3}
        config["data"]["source"] = str(corpus)
        (run / "config.json").write_text(json.dumps(config))
        summary = json.loads((run / "summary.json").read_text())
        summary = {k: v for k, v in summary.items() if not k.endswith("_bpb")} | extra
        summary["corpus_sha256"] = loaded.meta["sha256"]
        (run / "summary.json").write_text(json.dumps(summary))
    runs, curves = frames.load_runs(tmp_path / "r")
    want = bits_per_byte(2.0, tokens, size)
    assert runs.set_index("run_id")["best_val_bpb"].tolist() == pytest.approx([want, want], rel=1e-12)
    val = curves[(curves["split"] == "val")]
    assert val["bpb"].tolist() == pytest.approx((val["loss"] * want / 2.0).tolist())
    summary["corpus_sha256"] = "0" * 64  # another corpus than the one it trained on: unknown, never guessed
    (tmp_path / "r" / "old" / "summary.json").write_text(json.dumps(summary))
    runs, _ = frames.load_runs(tmp_path / "r")
    assert math.isnan(runs.set_index("run_id").loc["old", "best_val_bpb"])
