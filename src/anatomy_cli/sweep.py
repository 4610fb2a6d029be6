"""Ablation sweeps: expand(spec) -> [PlannedRun] (pure, no torch), then execute the plan.

Designs:
  one-at-a-time  the 2017 end, each flip added alone to it, the LLaMA end, each flip removed alone
  factorial      every combination of the chosen flips (others keep the base's values)
  list           named configs given as dotted overrides of the base
Extra `axes` are crossed with the design; every config is validated before any run starts.
Execution skips runs already completed (or diverged: that is a result), continues interrupted
ones from their checkpoint, reruns the rest from scratch, and holds a lock so two sweeps never
share a directory.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import runs
from .jobs import Event, Job, Stop, execute_local
from .lockfile import DirLock, Locked
from .config import (FLIPS, AblationSpec, ConfigError, ModelConfig, RunConfig, TrainConfig, apply_overrides,
                     load_toml, resolve_source, validate)

OFF: dict[str, dict[str, Any]] = {
    "rmsnorm": {"model.norm_type": "layernorm"},
    "prenorm": {"model.norm_pos": "post"},
    "rope": {"model.pos_type": "learned"},
    "swiglu": {"model.ffn_type": "gelu"},
}
ON: dict[str, dict[str, Any]] = {
    "rmsnorm": {"model.norm_type": "rmsnorm"},
    "prenorm": {"model.norm_pos": "pre"},
    "rope": {"model.pos_type": "rope"},
    "swiglu": {"model.ffn_type": "swiglu"},
}


DEFAULT_SPEC = "five-flips.toml"


def experiments_dir() -> Path:
    """./experiments when run from a checkout, else the copy packaged with anatomy."""
    from importlib import resources

    local = Path("experiments")
    if (local / DEFAULT_SPEC).is_file():
        return local
    packaged = resources.files("anatomy_cli") / "_experiments"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "experiments"


def load_spec(path: Path | None) -> AblationSpec:
    path = path or experiments_dir() / DEFAULT_SPEC
    data = resolve_source(load_toml(path), Path(path).parent, "base.data")
    return validate(AblationSpec, data)


def check_data(plan) -> dict[str | None, int]:
    """Read each distinct corpus once before any run starts: vocabulary size per source."""
    from .data import load_corpus

    sizes = {}
    for p in plan:
        d = p.config.data
        if d.source not in sizes:
            sizes[d.source] = len(load_corpus(d.source, d.val_frac, p.config.model.ctx_len).vocab)
    return sizes


class SweepLocked(Locked):
    """Another live process holds the sweep directory."""


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    slug: str  # e.g. '2017', '2017+rope', 'llama', 'llama-rope', with axis values appended
    role: str  # '2017', 'add-one', 'llama', 'remove-one', 'factorial', 'list'
    flip: str | None  # the flipped component for add-one / remove-one
    config: RunConfig


def parse_flips(text: str | None) -> list[str] | None:
    """'rope,swiglu' -> ['rope', 'swiglu']; unknown names are a ConfigError naming them."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FLIPS]
    if unknown or not names:
        raise ConfigError(f"unknown --flip name(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(FLIPS)}")
    return list(dict.fromkeys(names))


def axis_key(key: str) -> str:
    """Bare names are model or train fields ('n_layer' -> 'model.n_layer')."""
    if "." in key:
        return key
    if key in ModelConfig.model_fields:
        return f"model.{key}"
    if key in TrainConfig.model_fields:
        return f"train.{key}"
    raise ConfigError(f"axes.{key}: not a model or train field (use a dotted key such as train.warmup)")


def flip_overrides(spec: AblationSpec, flip: str, on: bool) -> dict[str, Any]:
    if flip != "gqa":
        return (ON if on else OFF)[flip]
    n_head = spec.base.model.n_head
    g = spec.gqa_kv_head or max(1, n_head // 2)
    if on and g >= n_head:
        raise ConfigError(f"gqa flip needs n_kv_head < n_head={n_head}; set gqa_kv_head (got {g})")
    return {"model.n_kv_head": g if on else n_head}


def merged(spec: AblationSpec, flips_on: list[str], flips_off: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in flips_off:
        out.update(flip_overrides(spec, f, False))
    for f in flips_on:
        out.update(flip_overrides(spec, f, True))
    return out


def design_points(spec: AblationSpec, flips: list[str]) -> list[tuple[str, str, str | None, dict]]:
    """(slug, role, flip, overrides) for each config of the design, before axes and seeds."""
    if spec.design == "list":
        return [(c.name, "list", None, dict(c.set)) for c in spec.configs]
    if spec.design == "factorial":
        points = []
        for mask in itertools.product((False, True), repeat=len(flips)):
            on = [f for f, m in zip(flips, mask) if m]
            off = [f for f, m in zip(flips, mask) if not m]
            points.append(("+".join(on) or "none", "factorial", None, merged(spec, on, off)))
        return points
    everything = list(FLIPS)
    points = [("2017", "2017", None, merged(spec, [], everything))]
    points += [(f"2017+{f}", "add-one", f, merged(spec, [f], [g for g in everything if g != f])) for f in flips]
    points.append(("llama", "llama", None, merged(spec, everything, [])))
    points += [(f"llama-{f}", "remove-one", f, merged(spec, [g for g in everything if g != f], [f])) for f in flips]
    return points


def expand(spec: AblationSpec, flips: list[str] | None = None, seeds: int | None = None,
           steps: int | None = None) -> list[PlannedRun]:
    """The full plan; raises ConfigError listing every invalid config before anything runs."""
    flips = flips or list(spec.flips)
    base = spec.base.model_dump(mode="json")
    if steps is not None:
        base["train"]["steps"] = steps
    seed_list = [spec.base.seed + i for i in range(seeds)] if seeds else spec.seed_list
    axes = {axis_key(k): v for k, v in spec.axes.items()}
    plan, errors, seen = [], [], set()
    for slug, role, flip, overrides in design_points(spec, flips):
        for values in itertools.product(*axes.values()):
            axis_over = dict(zip(axes, values))
            full_slug = "_".join([slug] + [f"{k.split('.')[-1]}={v}" for k, v in axis_over.items()])
            for seed in seed_list:
                data = apply_overrides(base, {**overrides, **axis_over, "seed": seed, "name": f"{spec.name}/{full_slug}"})
                try:
                    cfg = validate(RunConfig, data)
                except ConfigError as err:
                    errors.append(f"{full_slug} (seed {seed}): {err}")
                    continue
                rid = runs.run_id(full_slug, seed, cfg.model_dump(mode="json"))
                if rid not in seen:
                    seen.add(rid)
                    plan.append(PlannedRun(rid, full_slug, role, flip, cfg))
    if errors:
        raise ConfigError("invalid configs in the plan: " + "; ".join(errors))
    return plan


# Throughput assumed for plan estimates when no run of the sweep has finished yet (no torch import
# here): one core of a laptop CPU, fp32 training.
ASSUMED_FLOPS = 40e9


def estimate_seconds(cfg: RunConfig, flops_per_s: float = ASSUMED_FLOPS) -> float:
    m = cfg.model if cfg.model.vocab_size else cfg.model.model_copy(update={"vocab_size": 256})
    tokens = cfg.train.steps * cfg.train.batch_size * m.ctx_len
    evals = (cfg.train.steps // cfg.train.eval_interval + 1) * cfg.train.eval_batches * cfg.train.batch_size * m.ctx_len
    return m.flops_per_token() * (tokens + evals / 3) / flops_per_s


def measured_flops(sweep_dir: Path) -> tuple[float, int] | None:
    """(median training FLOP/s, runs) over the sweep's completed runs: calibrates the estimates."""
    rates = []
    for run_dir in runs.find_runs(sweep_dir) if Path(sweep_dir).is_dir() else []:
        summary = runs.read_summary(run_dir) or {}
        if summary.get("status") == runs.COMPLETED and summary.get("tokens_per_s"):
            model = ModelConfig.model_validate(runs.read_json(run_dir / runs.CONFIG)["model"])
            rates.append(summary["tokens_per_s"] * model.flops_per_token())
    return (sorted(rates)[len(rates) // 2], len(rates)) if rates else None


# ----------------------------------------------------------------------------------- execution


class SweepLock(DirLock):
    """sweep_dir/.lock names its live owner; the protocol (atomic take, race-free stale takeover)
    is lockfile.DirLock's."""

    error = SweepLocked

    def __init__(self, sweep_dir: Path):
        super().__init__(sweep_dir, "sweep directory")


def default_workers(n_runs: int) -> int:
    """Parallel processes: one per core up to the number of runs (measured: benchmarks/RESULTS.md)."""
    return max(1, min(os.cpu_count() or 1, n_runs))


def pending_runs(plan: list[PlannedRun], sweep_dir: Path) -> list[PlannedRun]:
    return [p for p in plan if runs.run_status(Path(sweep_dir) / p.run_id) not in runs.DONE_STATES]


def execute(plan: list[PlannedRun], sweep_dir: Path, workers: int = 1, on_event: Event | None = None,
            sweep_name: str | None = None, executor: str = "local", address: str | None = None,
            stop: Stop | None = None) -> list[dict]:
    """Run every pending run of the plan into sweep_dir/<run_id>; return all summaries.

    executor 'local' runs in this process (workers=1) or a process pool; 'dask' submits each run
    to an existing dask.distributed cluster at `address` (see dask_exec.py). When stop() turns
    true (local executor) the runs in flight save and end 'interrupted', no new run starts, and
    this returns after every worker has exited, with the lock released: a rerun resumes the sweep.
    """
    sweep_dir = Path(sweep_dir)
    if runs.is_run_dir(sweep_dir):  # runs inside a run: its report would see only the outer one
        raise runs.RunError(f"{sweep_dir} is a run directory, not a sweep directory; choose another --runs-dir")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda e: None)
    with SweepLock(sweep_dir):
        todo = pending_runs(plan, sweep_dir)
        emit({"event": "plan", "total": len(plan), "todo": len(todo), "skipped": len(plan) - len(todo)})
        threads = max(1, (os.cpu_count() or 1) // max(1, workers))
        todo_jobs = [Job(p.run_id, p.config.model_dump(mode="json"), str(sweep_dir / p.run_id), threads,
                         {"sweep": sweep_name, "role": p.role, "flip": p.flip}) for p in todo]
        if executor == "dask":
            from .dask_exec import execute_dask

            execute_dask(todo_jobs, address, emit)
        else:
            execute_local(todo_jobs, workers, emit, stop)
    return [runs.read_summary(sweep_dir / p.run_id) or {} for p in plan]


