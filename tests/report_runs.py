"""Run directories written by hand for the report's tests: what train.py would leave, only what the report
reads (no torch, no training), and the small studies built from them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from anatomy_cli.spec.components import FIVE as FLIPS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = {"forest.png", "curves.png", "effects-over-training.png"}  # speed.png only with a timing pass
T2 = 4.3026527  # t(0.975, df=2), from a printed table to 7 digits


def model_for(flips, n_layer=4):
    flips = set(flips)
    return {
        "vocab_size": 65, "d_model": 32, "n_layer": n_layer, "n_head": 4,
        "n_kv_head": 1 if "gqa" in flips else 4, "ctx_len": 64,
        "norm_type": "rmsnorm" if "rmsnorm" in flips else "layernorm",
        "norm_pos": "pre" if "prenorm" in flips else "post",
        "pos_type": "rope" if "rope" in flips else "learned",
        "ffn_type": "swiglu" if "swiglu" in flips else "gelu",
        "rope_base": 10000.0, "norm_eps": 1e-5, "rope_variant": "standard",
    }


def make_run(root, name, flips=(), seed=1, best=2.0, final=None, status="completed",
             tokens_per_s=1000.0, n_layer=4, metrics=None, summary=True, samples=None,
             eval_ctx=None):
    """A run dir as train.py would leave it; only what the report reads."""
    run = Path(root) / name
    run.mkdir(parents=True)
    config = {"name": name, "seed": seed, "model": model_for(flips, n_layer),
              "train": {"steps": 20, "batch_size": 4, "lr": 1e-3, "warmup": 2},
              "data": {"source": None, "val_frac": 0.1}}
    (run / "config.json").write_text(json.dumps(config))
    if metrics is None:
        metrics = [{"step": s, "train_loss": 3.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3,
                    "tokens": 100 * s} for s in range(5)]
        metrics[-1] |= {"val_loss": best, "elapsed_s": 1.0}
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if summary:
        final = best if final is None else final
        (run / "summary.json").write_text(json.dumps({
            "status": status, "run_id": name, "seed": seed, "params": 12345,
            "best_val_loss": best, "best_step": 4, "final_val_loss": final,
            # one byte per ln 2 nats of a token: the report's bits per byte are these numbers as they are
            "best_val_bpb": best, "final_val_bpb": final,
            "bits_per_char": None if best is None else best / math.log(2), "tokens_per_s": tokens_per_s,
            "step_time_ms": 5.0, "wall_s": 1.0, "diverged_at": 3 if status == "diverged" else None,
            "error": None, "sweep": None}))
    if samples is not None:
        (run / "samples.txt").write_text(samples)
    if eval_ctx is not None:
        (run / "eval.json").write_text(json.dumps({"val_loss_by_ctx": eval_ctx, "ctx_len": 64}))
    return run


def effect(effects, flip, direction, **match):
    rows = effects[(effects["flip"] == flip) & (effects["direction"] == direction)]
    for key, value in match.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def sweep(root):
    for seed in (1, 2):
        make_run(root, f"base-s{seed}", seed=seed, best=2.0 + seed / 10, samples="## the ``` base")
        make_run(root, f"llama-s{seed}", flips=FLIPS, seed=seed, best=1.7, samples="## llama <b>")
        make_run(root, f"rope-s{seed}", flips=("rope",), seed=seed, best=1.9)
    make_run(root, "swiglu-s1", flips=("swiglu",), seed=1, status="diverged", best=float("nan"))
    make_run(root, "gqa-s1", flips=("gqa",), metrics=[], summary=False)


def p_df2(deltas):
    """Two-sided paired t-test p for three pairs, by hand: df = 2 has P(|T| < t) = t / sqrt(2 + t^2)."""
    d = np.asarray(deltas, dtype=float)
    t = abs(d.mean()) / (d.std(ddof=1) / math.sqrt(3))
    return 1.0 - t / math.sqrt(2.0 + t * t)


def constructed(gains: dict[str, list[float]], margin: float) -> dict[str, dict]:
    """stats.judge over effects whose paired gains are given by hand: {name: row}."""
    from anatomy_cli.report import stats

    rows = stats.judge([stats.paired(g) for g in gains.values()], margin)
    return dict(zip(gains, rows))


def five_sweep_json(root, **invocation):
    from anatomy_cli.spec import components

    root.mkdir(parents=True, exist_ok=True)
    doc = {"components": [components.record(components.BY_NAME[n]) for n in FLIPS], "invocation": invocation}
    (root / "sweep.json").write_text(json.dumps(doc))


ONE_SEED = {"2017": ((), 2.9), "rope": (("rope",), 2.5), "swiglu": (("swiglu",), 2.8), "gqa": (("gqa",), 2.95),
            "llama": (FLIPS, 2.3), "llama-rope": (tuple(f for f in FLIPS if f != "rope"), 2.6)}


def timing_record():
    return {"steps": 10, "warmup": 2, "rounds": 3, "threads": 1, "ends": ["2017", "llama"],
            "configs": [{"slug": "2017", "role": "reference", "flip": None},
                        {"slug": "2017+gqa", "role": "add-one", "flip": "gqa"},
                        {"slug": "llama", "role": "all-on", "flip": None},
                        {"slug": "llama-gqa", "role": "remove-one", "flip": "gqa"}],
            "rounds_data": [{"2017": 1000.0, "2017+gqa": 1100.0, "llama": 900.0, "llama-gqa": 900.0},
                            {"2017": 500.0, "2017+gqa": 600.0, "llama": 1000.0, "llama-gqa": 800.0},  # a slow round
                            {"2017": 1000.0, "2017+gqa": 1150.0, "llama": 900.0, "llama-gqa": 810.0}]}


CALLED = {"rope": ((0.3, 0.31, 0.305), "helps"), "gqa": ((-0.2, -0.21, -0.205), "hurts"),
          "rmsnorm": ((0.001, 0.0012, 0.0011), "negligible"), "swiglu": ((0.1, -0.1, 0.05), "undecided"),
          "prenorm": ((0.4, 0.41), "too few seeds")}  # gains by seed; the 2017 end's sd is 0.01


def called_sweep(root):
    for i, seed in enumerate((1, 2, 3)):
        base = 2.0 + 0.01 * i
        make_run(root, f"base-s{seed}", seed=seed, best=base)
        for flip, (gains, _) in CALLED.items():
            if i < len(gains):
                make_run(root, f"{flip}-s{seed}", flips=(flip,), seed=seed, best=base - gains[i])


def anatomy_results(*argv: str) -> tuple[int, str]:
    """`anatomy results ARGV` (what `make results` runs) through the CLI: (exit code, its stderr)."""
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    done = CliRunner().invoke(app, ["results", *argv])
    return done.exit_code, done.stderr
