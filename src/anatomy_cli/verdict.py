"""The answer a report leads with: each component's worth, ranked, and what it holds for (no torch).

  verdict_frame   loss effects -> one row per component and direction, as a gain (positive = the
                  component helps), ranked, with the Holm-corrected call
  noise_floor     the seed-to-seed spread of each end's best val loss (the yardstick for "small")
  budget          the training budget the verdict holds for, and how far apart the two ends are
  more_seeds      the exact `anatomy ablate` command that adds seeds, with its estimated time

Sign convention. An add-one delta is loss(reference end + f) - loss(reference end), so a component
that helps has a negative delta; a remove-one delta is loss(all-on end - f) - loss(all-on end), so
a component that helps has a positive one. The verdict turns both into one number, the gain in
nats/char of having the component (add-one: -delta; remove-one: +delta), so one ranking reads both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from anatomy_cli import runs as runs_mod

SEEDS_WANTED = 3
VERDICT_COLUMNS = ["rank", "flip", "direction", "against", "group", "n_pairs", "gain", "gain_low", "gain_high",
                   "p_holm", "call"]
ONE_SEED = "one seed, no interval"


def verdict_frame(loss_effects: pd.DataFrame) -> pd.DataFrame:
    """Loss effects (component_effects rows) -> VERDICT_COLUMNS, largest gain first."""
    rows = []
    for e in loss_effects.itertuples():
        sign = -1.0 if e.direction == "add-one" else 1.0
        lo, hi = sorted((sign * e.ci_low, sign * e.ci_high)) if np.isfinite(e.ci_low) else (math.nan, math.nan)
        gain = sign * e.mean_delta
        rows.append({"flip": e.flip, "direction": e.direction, "against": e.against, "group": e.group,
                     "n_pairs": e.n_pairs, "gain": gain, "gain_low": lo, "gain_high": hi, "p_holm": e.p_holm,
                     "call": _call(e.n_pairs, e.within_noise, gain)})
    df = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    df = df.sort_values("gain", ascending=False, na_position="last", kind="stable").reset_index(drop=True)
    df["rank"] = np.arange(1, len(df) + 1)
    return df


def _call(n_pairs: int, within_noise, gain: float) -> str:
    if n_pairs == 0 or not math.isfinite(gain):
        return "no completed pairs"
    if n_pairs == 1:
        return ONE_SEED
    if within_noise:
        return "within noise (Holm)"
    return "helps" if gain > 0 else "hurts"


def noise_floor(runs: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """{'reference' | 'all-on': (sd of best val loss over seeds, seeds)} for each end that has runs.

    The sd is over completed runs of one config (the group with the most seeds); NaN with one seed.
    """
    out = {}
    for role in ("reference", "all-on"):
        done = runs[(runs["role"] == role) & (runs["status"] == runs_mod.COMPLETED)]
        if done.empty:
            continue
        best = max((g for _, g in done.groupby(["design", "settings"])), key=len)
        values = best.drop_duplicates("seed")["best_val_loss"].to_numpy(float)
        values = values[np.isfinite(values)]
        out[role] = (float(np.std(values, ddof=1)) if len(values) > 1 else math.nan, len(values))
    return out


def budget(runs: pd.DataFrame) -> dict:
    """steps, batch, ctx, tokens of the reference-end runs; each end's mean best val loss; whether
    the reference end was still improving at its last evaluation."""
    out: dict = {}
    for role in ("reference", "all-on"):
        done = runs[(runs["role"] == role) & (runs["status"] == runs_mod.COMPLETED)]
        if len(done):
            out[role] = float(done["best_val_loss"].mean())
            out[f"{role}_best_step"] = int(done["best_step"].min())
    ref = runs[runs["role"].isin(["reference", "all-on"])]
    if len(ref):
        settings = json.loads(ref.iloc[0]["settings"])
        steps, batch, ctx = (settings.get(k) for k in ("train.steps", "train.batch_size", "model.ctx_len"))
        out |= {"steps": steps, "batch_size": batch, "ctx_len": ctx}
        if None not in (steps, batch, ctx):
            out["tokens"] = steps * batch * ctx
        if "reference_best_step" in out and steps:
            out["still_improving"] = out["reference_best_step"] >= steps
    return out


def more_seeds(root: Path, runs: pd.DataFrame, wanted: int = SEEDS_WANTED) -> tuple[str, tuple[float, int] | None]:
    """(the command that brings every config to `wanted` seeds, (estimated seconds, workers) or None).

    The command repeats the invocation sweep.json recorded (spec, --flip, --steps); completed runs
    are skipped by the sweep, so it trains only the new seeds. The estimate is the plan's own
    (sweep.estimate_seconds at the FLOP/s measured over the sweep's finished runs).
    """
    root = Path(root)
    design = runs_mod.read_design(root) or {}
    how = design.get("invocation") or {}
    spec = how.get("spec")
    if spec is None and not how:
        guess = Path("experiments") / f"{root.name}.toml"
        spec = str(guess) if guess.is_file() else "SPEC"
    parts = ["anatomy", "ablate"] + ([str(spec)] if spec else [])
    if how.get("flip"):
        parts += ["--flip", str(how["flip"])]
    if how.get("steps"):
        parts += ["--steps", str(how["steps"])]
    parts += ["--seeds", str(wanted), "--runs-dir", str(root.parent)]
    return " ".join(parts), _estimate(root, runs, wanted)


def _estimate(root: Path, runs: pd.DataFrame, wanted: int) -> tuple[float, int] | None:
    from anatomy_cli.config import RunConfig
    from anatomy_cli.sweep import ASSUMED_FLOPS, default_workers, estimate_seconds, measured_flops

    studied = runs[runs["role"] != ""]
    if studied.empty:
        return None
    measured = measured_flops(root) if root.is_dir() else None
    rate = measured[0] if measured else ASSUMED_FLOPS
    total, n_new = 0.0, 0
    for _, config_runs in studied.groupby(["design", "settings", "role"]):
        missing = wanted - config_runs["seed"].nunique()
        if missing <= 0:
            continue
        try:
            cfg = RunConfig.model_validate(runs_mod.read_json(Path(config_runs.iloc[0]["path"]) / runs_mod.CONFIG))
        except (ValueError, runs_mod.RunError):
            return None
        total += missing * estimate_seconds(cfg, rate)
        n_new += missing
    workers = default_workers(n_new) if n_new else 1
    return total / workers, workers
