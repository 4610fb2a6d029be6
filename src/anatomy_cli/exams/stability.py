"""Depth stability: per label, runs, diverged, mean loss spikes, max grad norm, mean best val loss (no torch).

  stability_table  report.frames.load_runs frame -> one row per label

Made for experiments/depth-stability.toml (12 layers, no warmup, post- vs pre-norm).
"""

from __future__ import annotations

import math

from anatomy_cli.store import runs

# ------------------------------------------------------------------------------ 2. depth stability

STABILITY_COLUMNS = ["label", "n_runs", "diverged", "loss_spikes_mean", "max_grad_norm", "best_val_loss_mean"]


def stability_table(runs_df):
    """One row per label (in order of appearance) from a report.frames.load_runs frame.

    diverged counts runs whose status is 'diverged'; max_grad_norm is the largest logged
    (pre-clip) gradient norm of any run of the label; best_val_loss_mean averages completed runs
    only (a diverged run's best loss is from before it blew up, so it would flatter the label).
    """
    import pandas as pd

    rows = []
    for label, g in runs_df.groupby("label", sort=False):
        completed = g[g["status"] == runs.COMPLETED]
        rows.append({
            "label": label,
            "n_runs": len(g),
            "diverged": int((g["status"] == runs.DIVERGED).sum()),
            "loss_spikes_mean": float(g["loss_spikes"].astype(float).mean()),
            "max_grad_norm": float(g["max_grad_norm"].max()),
            "best_val_loss_mean": float(completed["best_val_loss"].mean()) if len(completed) else math.nan,
        })
    return pd.DataFrame(rows, columns=STABILITY_COLUMNS)
