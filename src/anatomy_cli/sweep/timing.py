"""A fair timing pass: every config of a sweep timed for a few steps, interleaved in rounds (the running half).

Why. A sweep's tokens/s come from runs that shared the CPU with whichever other runs happened to
overlap them (two workers, a neighbour's job), so their ratios measure scheduling as much as the
component. Here every config runs the same short stretch of training (`warmup` untimed steps, then
`steps` timed ones) in one otherwise idle worker process, one config at a time, and the configs take
turns in rounds (the order rotates each round, so no config always runs first or after the same
one). report/speed.py reads the record back and judges it.

  time_plan        plan -> timing record (runs in a spawned worker; needs torch there, not here)
  roles            each config's role in its design (components.role), as the report reads a run's
  write_timing     sweep_dir/timing.json

This module imports torch only inside the worker function.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, REFERENCE, REMOVE_ONE, parse_variant, variant
from anatomy_cli.store import runs

# --------------------------------------------------------------------------- running (torch in the worker)


def time_plan(plan, steps: int = 20, rounds: int = 5, warmup: int = 3, threads: int = 1,
              on_round: Callable[[int, int], None] | None = None) -> dict:
    """Time one run per config of the plan (its first seed), `rounds` times, in a spawned worker
    (worker.Worker: an interrupt ends it at once, and it never outlives this process)."""
    from anatomy_cli.sweep.worker import Worker

    first = {}
    for p in plan:
        first.setdefault(p.slug, p)
    configs = list(first.values())
    design = next((p.design for p in configs if p.design), None)
    record = {"steps": steps, "warmup": warmup, "rounds": rounds, "threads": threads,
              "ends": list(design.ends) if design else [REFERENCE, ALL_ON],
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
    from anatomy_cli.spec import components as comp

    comps = design.components if design else ()
    names = [c.name for c in comps]
    keys = [comp.settings_key(comp.flat_config(p.config), comps) for p in configs]
    labels = comp.group_names(f"|{k}" for k in keys)
    out = []
    for p, key in zip(configs, keys):
        flat = comp.flat_config(p.config)
        role = comp.role({c.name: c.state(flat) for c in comps}, names) if comps else ""
        alone = parse_variant(role)  # with two components, A alone is also the all-on end minus B
        entries = [role] + ([variant(next(n for n in names if n != alone[1]), REMOVE_ONE)]
                            if len(names) == 2 and alone and alone[0] == ADD_ONE else [])
        for r in entries:
            direction, flip = parse_variant(r) or (r or "other", None)
            out.append({"slug": p.slug, "role": direction, "flip": flip, "group": labels[f"|{key}"]})
    return out


def time_round(jobs: list[tuple[str, dict]], steps: int, warmup: int, threads: int) -> dict[str, float]:
    """{slug: tokens/s} for each config, timed one after another in this process."""
    import torch

    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.spec.config import RunConfig
    from anatomy_cli.training.run import resolve_config
    from anatomy_cli.training.trainer import Trainer

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
    key = (cfg.data.source, cfg.data.val_frac, cfg.model.ctx_len, cfg.data.tokenizer)
    if key not in _CORPORA:
        _CORPORA[key] = load_corpus(*key)
    return _CORPORA[key]


# --------------------------------------------------------------------------- files and effects (no torch)


def write_timing(sweep_dir: Path, record: dict) -> Path:
    path = Path(sweep_dir) / runs.TIMING
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    runs.atomic_write_json(path, record)
    return path
