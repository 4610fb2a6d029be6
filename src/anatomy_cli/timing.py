"""A fair timing pass: every config of a sweep timed for a few steps, interleaved in rounds.

Why. A sweep's tokens/s come from runs that shared the CPU with whichever other runs happened to
overlap them (two workers, a neighbour's job), so their ratios measure scheduling as much as the
component. Here every config runs the same short stretch of training (`warmup` untimed steps, then
`steps` timed ones) in one otherwise idle worker process, one config at a time, and the configs take
turns in rounds (the order rotates each round, so no config always runs first or after the same
one). A component's speed effect is paired within a round, where both configs met the same machine
state: gain_r = 100 * (tokens/s with the component / tokens/s without it - 1), judged over rounds
by the report's one rule (stats.py), with the reference end's round-to-round spread as threshold.

  time_plan        plan -> timing record (runs in a spawned worker; needs torch there, not here)
  write_timing / read_timing   sweep_dir/timing.json
  timing_effects   timing record -> effect rows (stats.paired) for tokens_per_s, as gains
  threshold        the reference end's round-to-round spread of tokens/s, in %

This module imports torch only inside the worker function.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from anatomy_cli import runs
from anatomy_cli import stats

TIMING = "timing.json"
METRIC = "tokens_per_s"
NOTE_RE = r"timing pass: [^;]*"  # the note every timing effect carries


# --------------------------------------------------------------------------- running (torch in the worker)


def time_plan(plan, steps: int = 20, rounds: int = 5, warmup: int = 3, threads: int = 1,
              on_round: Callable[[int, int], None] | None = None) -> dict:
    """Time one run per config of the plan (its first seed), `rounds` times, in a spawned worker
    (worker.Worker: an interrupt ends it at once, and it never outlives this process)."""
    from anatomy_cli.worker import Worker

    first = {}
    for p in plan:
        first.setdefault(p.slug, p)
    configs = list(first.values())
    design = next((p.design for p in configs if p.design), None)
    record = {"steps": steps, "warmup": warmup, "rounds": rounds, "threads": threads,
              "ends": list(design.ends) if design else ["reference", "all-on"],
              "configs": roles(configs, design), "rounds_data": []}
    jobs = [(p.slug, p.config.model_dump(mode="json")) for p in configs]
    with Worker() as worker:
        for r in range(rounds):
            k = r % len(jobs)
            order = jobs[k:] + jobs[:k]  # rotate: each config takes each position once per len(jobs) rounds
            result = worker.call(time_round, order, steps, warmup, threads)
            record["rounds_data"].append(result)
            if on_round:
                on_round(r + 1, rounds)
    return record


def roles(configs, design) -> list[dict]:
    """{slug, role, flip, group} per config, read from its settings as the report reads a run's: any
    design (one-at-a-time either way, factorial, list) yields the ends and add-one / remove-one
    configs it holds, within each group of axis values; with two components, A alone is also the
    all-on end minus B."""
    import pandas as pd

    from anatomy_cli import components as comp
    from anatomy_cli import report as rep

    comps = design.components if design else ()
    names = [c.name for c in comps]
    keys = [rep._settings_key(comp.flat_config(p.config), comps) for p in configs]
    labels = rep._group_names(pd.Series([f"|{k}" for k in keys]))
    out = []
    for p, key in zip(configs, keys):
        flat = comp.flat_config(p.config)
        role = rep._role({c.name: c.state(flat) for c in comps}, names) if comps else ""
        entries = [role] + ([f"-{next(n for n in names if n != role[1:])}"] if len(names) == 2 and role[:1] == "+"
                            else [])
        for r in entries:
            kind = {"+": "add-one", "-": "remove-one"}.get(r[:1], r or "other")
            out.append({"slug": p.slug, "role": kind, "flip": r[1:] if r[:1] in "+-" and r else None,
                        "group": labels[f"|{key}"]})
    return out


def time_round(jobs: list[tuple[str, dict]], steps: int, warmup: int, threads: int) -> dict[str, float]:
    """{slug: tokens/s} for each config, timed one after another in this process."""
    import torch

    from anatomy_cli.config import RunConfig
    from anatomy_cli.data import load_corpus
    from anatomy_cli.train import resolve_config
    from anatomy_cli.trainer import Trainer

    torch.set_num_threads(threads)
    out = {}
    for slug, config in jobs:
        cfg = RunConfig.model_validate(config)
        corpus = _corpus(load_corpus, cfg)
        cfg = resolve_config(cfg, corpus)
        with tempfile.TemporaryDirectory(prefix="anatomy-time-") as tmp:
            tr = Trainer(cfg, Path(tmp) / "run", corpus)  # no folder: no event file; no flush, no metrics
            tr.train_steps(warmup)
            tr.sync()
            t0 = time.perf_counter()
            tr.train_steps(steps)
            tr.sync()
            dt = time.perf_counter() - t0
        out[slug] = steps * cfg.train.batch_size * cfg.model.ctx_len / dt
    return out


_CORPORA: dict = {}


def _corpus(load_corpus, cfg):
    key = (cfg.data.source, cfg.data.val_frac, cfg.model.ctx_len)
    if key not in _CORPORA:
        _CORPORA[key] = load_corpus(*key)
    return _CORPORA[key]


# --------------------------------------------------------------------------- files and effects (no torch)


def write_timing(sweep_dir: Path, record: dict) -> Path:
    path = Path(sweep_dir) / TIMING
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    runs.atomic_write_json(path, record)
    return path


def read_timing(sweep_dir: Path) -> dict | None:
    path = Path(sweep_dir) / TIMING
    return runs.read_json(path) if path.is_file() else None


def timing_effects(record: dict) -> list[dict]:
    """Speed effect rows of a timing record, each variant against its end paired within rounds, as a
    gain: 100 * (tokens/s with the component / without - 1) %, positive = faster (stats.gain)."""
    by_role = {(c.get("group", ""), c["role"], c["flip"]): c["slug"] for c in record["configs"]}
    ends = record.get("ends") or ["reference", "all-on"]
    ends = ["LLaMA" if e == "llama" else e for e in ends]
    rows = []
    for (group, role, flip), slug in by_role.items():
        if role not in ("add-one", "remove-one"):
            continue
        ref = by_role.get((group, "reference" if role == "add-one" else "all-on", None))
        if ref is None:
            continue
        pairs = np.array([(r[ref], r[slug]) for r in record["rounds_data"] if slug in r and ref in r and r[ref] > 0
                          and r[slug] > 0], dtype=float).reshape(-1, 2)
        gains = stats.gain(pairs[:, 0], pairs[:, 1], role == "add-one", relative=True, higher_is_better=True)
        gains = gains[np.isfinite(gains)]
        rows.append({"metric": METRIC, "flip": flip, "direction": role, "against": f"{ends[role == 'remove-one']} end",
                     "group": group, "excluded": len(record["rounds_data"]) - len(gains), "unit": "%",
                     "note": (f"timing pass: {len(gains)} rounds x {record['steps']} steps, "
                              f"{record['threads']} thread(s), paired within rounds"), **stats.paired(gains)})
    return rows


def threshold(record: dict) -> float:
    """The speed effects' smallest effect that matters: the reference end's round-to-round sd of
    tokens/s in percent of its mean (its noise floor, as the seed-to-seed sd is for loss)."""
    ref = next((c["slug"] for c in record["configs"] if c["role"] == "reference"),
               next((c["slug"] for c in record["configs"] if c["role"] == "all-on"), None))
    tps = np.array([r[ref] for r in record["rounds_data"] if ref in r], dtype=float)
    return float(100.0 * tps.std(ddof=1) / tps.mean()) if len(tps) > 1 else math.nan


def summary_line(record: dict) -> str:
    tps = [v for r in record["rounds_data"] for v in r.values()]
    return (f"timing pass: {len(record['configs'])} configs x {len(record['rounds_data'])} rounds x "
            f"{record['steps']} timed steps (after {record['warmup']} untimed), one config at a time in one "
            f"worker process with {record['threads']} thread(s); tokens/s from {min(tps):,.0f} to {max(tps):,.0f}"
            if tps else "timing pass: no rounds")


def fmt_gain(row: dict) -> str:
    """'+12.3% [+8.1, +16.5]' (the adjusted interval) or '+12.3%' without one."""
    lo, hi = row.get("adj_low", math.nan), row.get("adj_high", math.nan)
    return f"{row['gain']:+.1f}% [{lo:+.1f}, {hi:+.1f}]" if math.isfinite(lo) else f"{row['gain']:+.1f}%"
