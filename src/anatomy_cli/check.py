"""The CI regression gate: best val loss per config against a committed baseline (no torch).

Baseline file (JSON): per config slug, the best val loss of the gate seed measured on the reference
machine, plus every seed's value. The default tolerance comes from that measured spread, not a
guess: TOLERANCE_SIGMAS x the pooled seed-to-seed standard deviation (pooled over all configs,
which share one noise level; a per-config std from 4 seeds is itself too noisy), never below
MIN_TOLERANCE. A config regresses when now > baseline + tolerance: a move larger than reseeding
explains. Getting better never fails the gate. On the same machine and torch the gate seed
reproduces its numbers exactly, so the table also says whether each number is identical.
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import statistics
from pathlib import Path

from . import runs

TOLERANCE_SIGMAS = 2.0
MIN_TOLERANCE = 0.005


class BaselineError(ValueError):
    """A missing or malformed baseline file."""


def collect(sweep_dir: Path) -> dict[str, dict[int, float | None]]:
    """{slug: {seed: best val loss or None when the run did not complete}}."""
    out: dict[str, dict[int, float | None]] = {}
    for run_dir in runs.find_runs(sweep_dir):
        summary = runs.read_summary(run_dir) or {}
        config = runs.read_json(run_dir / runs.CONFIG)
        slug = config["name"].rsplit("/", 1)[-1]  # sweeps name runs '<spec>/<slug>'
        ok = summary.get("status") == runs.COMPLETED
        out.setdefault(slug, {})[config["seed"]] = summary.get("best_val_loss") if ok else None
    return out


def build_baseline(results: dict[str, dict[int, float | None]], gate_seed: int, spec_name: str,
                   torch_version: str, hardware: str) -> dict:
    configs, variances = {}, []
    for slug, by_seed in sorted(results.items()):
        values = [v for v in by_seed.values() if v is not None]
        if by_seed.get(gate_seed) is None or len(values) < 2:
            raise BaselineError(f"{slug}: need the gate seed {gate_seed} and >= 2 completed seeds to measure spread")
        variances.append(statistics.variance(values))
        configs[slug] = {
            "best_val_loss": by_seed[gate_seed],
            "seed_values": {str(s): v for s, v in sorted(by_seed.items())},
            "seed_std": statistics.stdev(values),
        }
    pooled = math.sqrt(sum(variances) / len(variances))
    for entry in configs.values():
        entry["tolerance"] = max(MIN_TOLERANCE, TOLERANCE_SIGMAS * pooled)
    n_seeds = len(next(iter(results.values())))
    return {
        "spec": spec_name,
        "gate_seed": gate_seed,
        "pooled_seed_std": pooled,
        "derivation": f"best_val_loss is the gate seed's; tolerance = max({MIN_TOLERANCE}, {TOLERANCE_SIGMAS} x the "
                      f"pooled std of best_val_loss over {n_seeds} seeds x {len(configs)} configs "
                      f"= {TOLERANCE_SIGMAS} x {pooled:.4f})",
        "torch_version": torch_version,
        "machine": hardware,
        "platform": platform.platform(),
        "measured_on": dt.date.today().isoformat(),
        "configs": configs,
    }


def load_baseline(path: Path) -> dict:
    try:
        data = runs.read_json(path)
    except runs.RunError as err:
        raise BaselineError(f"baseline {path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("configs"), dict):
        raise BaselineError(f"baseline {path} has no 'configs' table")
    for slug, entry in data["configs"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("best_val_loss"), (int, float)):
            raise BaselineError(f"baseline {path}: config {slug!r} lacks a numeric best_val_loss")
    return data


def compare(baseline: dict, results: dict[str, dict[int, float | None]], tolerance: float | None = None) -> list[dict]:
    """One row per baseline config: baseline, now, delta, allowed, verdict ('ok' | 'REGRESSED' | 'MISSING')."""
    seed = baseline.get("gate_seed")
    rows = []
    for slug, entry in baseline["configs"].items():
        now = results.get(slug, {}).get(seed) if seed is not None else next(iter(results.get(slug, {}).values()), None)
        allowed = tolerance if tolerance is not None else float(entry.get("tolerance", MIN_TOLERANCE))
        base = float(entry["best_val_loss"])
        if now is None or not math.isfinite(now):
            rows.append({"config": slug, "baseline": base, "now": None, "delta": None, "allowed": allowed,
                         "verdict": "MISSING"})
            continue
        delta = now - base
        rows.append({"config": slug, "baseline": base, "now": now, "delta": delta, "allowed": allowed,
                     "identical": now == base, "verdict": "REGRESSED" if delta > allowed else "ok"})
    return rows


def passed(rows: list[dict]) -> bool:
    return all(r["verdict"] == "ok" for r in rows)
