"""Plan estimates from this machine's measured times: a short calibration, cached (no torch here).

A FLOP count alone says 1 s for a toy study that takes 27 s: small runs are dominated by what is
not matrix multiplication (Python per step, evaluations, samples, checkpoints, start-up). So each
shape class of a plan (model size, context, batch, vocab, threads, device, torch version) is timed
once, in a spawned worker (worker.Worker: it never outlives this process, however this one dies)
that trains exactly as a sweep's worker does (train.train into a scratch folder): one run of N steps
with E evaluations, read from its own clock (the Trainer's train time covers the steps alone, its
loop time the steps, evaluations and checkpoints):
  step_s = train time / N,   eval_s = (loop time - train time) / E,
  run_s = the rest of the call less step 0's evaluation (build, samples, files),
and startup_s is the worker's start (interpreter, torch import, corpus, and one short warm-up run
that pays the process's first-use costs, as a sweep worker's first run does). A run of the class is
then
  run_s + steps x step_s + evaluations x eval_s
with step and evaluation scaled by the run's FLOPs per token against the calibrated config's, and
a plan is its runs packed onto the workers, longest first, plus one start-up per worker. (Timing
each quantity directly, not as a difference of two short runs, is what keeps a small model's
estimate honest: differences of 10-step runs came out negative on the first shape a worker timed,
whose first run paid the warm-up, and an estimate of 34 s for a size that took 5 min.)

The cache is CACHE_DIR/calibration.json ($ANATOMY_CACHE, else $XDG_CACHE_HOME/anatomy, else
~/.cache/anatomy). A calibration taken while the machine was busy (load average above its cores) is
marked so and taken again when the machine is idle; busy() lets a plan say the machine is busy
instead of hiding it in the estimate.

The cache is read through Calibration (finite, non-negative times; the right keys and types): an
entry that is not one, or a file that is not a JSON object, counts as absent, so that shape is
measured again and the entry rewritten. A cache that cannot be written (a read-only folder,
$ANATOMY_CACHE naming a file, a folder where the file is) leaves the measurement used but uncached.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, StrictBool, StrictStr, ValidationError

N, E = 30, 3  # steps and evaluations of a calibration run
METHOD = 2  # in every cache key: a calibration taken another way is measured again

Seconds = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]


class Calibration(BaseModel):
    """One cached calibration: what run_seconds and plan_seconds read, checked (a string, NaN, inf or
    negative time, or a missing one, makes the entry invalid: measured again, not trusted)."""

    step_s: Seconds
    eval_s: Seconds
    run_s: Seconds
    startup_s: Seconds
    when: StrictStr = ""
    busy: StrictBool = False


def cache_path() -> Path:
    root = (os.environ.get("ANATOMY_CACHE")
            or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anatomy")
    return Path(root) / "calibration.json"


def busy() -> tuple[float, int] | None:
    """(1-minute load average, cores) when the machine is busier than its cores, else None."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return (load, cores) if load > cores else None


def shape_key(cfg, vocab: int, threads: int) -> str:
    m, t = cfg.model, cfg.train
    return json.dumps({"method": METHOD, "torch": _torch_version(), "device": t.device, "threads": threads,
                       "d_model": m.d_model, "n_layer": m.n_layer, "n_head": m.n_head, "ctx_len": m.ctx_len,
                       "vocab": vocab, "batch": t.batch_size, "eval_batches": t.eval_batches,
                       "sample_len": t.sample_len, "dtype": t.dtype, "compile": t.compile}, sort_keys=True)


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "?"


def run_seconds(cfg, cal: dict, flops_ratio: float = 1.0) -> float:
    t = cfg.train
    evals = t.steps // t.eval_interval + 1 + (t.steps % t.eval_interval != 0)
    return cal["run_s"] + flops_ratio * (t.steps * cal["step_s"] + evals * cal["eval_s"])


def plan_seconds(runs: list[float], workers: int, startup_s: float) -> float:
    """Wall time of runs packed onto `workers` processes, longest first, plus one start-up each."""
    loads = [0.0] * max(1, min(workers, len(runs) or 1))
    for s in sorted(runs, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads) + startup_s


def fmt_seconds(s: float) -> str:
    """An estimate or a wall time as a plan line says it: '38s' under 90 s, else '11.1min'."""
    return f"{s:.0f}s" if s < 90 else f"{s / 60:.1f}min"


def read_cache(path: Path | None = None) -> dict[str, dict]:
    """{shape key: calibration} of the cache's valid entries; {} for a missing, unreadable or invalid file."""
    try:
        raw = json.loads((path or cache_path()).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    cache = {}
    for key, entry in raw.items():
        try:
            cache[key] = Calibration.model_validate(entry).model_dump()
        except ValidationError:
            continue  # absent: measured again when a plan needs it
    return cache


def _write_cache(path: Path, cache: dict[str, dict]) -> None:
    """Write the cache atomically; when it cannot be written the measurements are used uncached."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def cached_overheads() -> tuple[float, float]:
    """(per-run seconds, start-up seconds) of the most recent cached calibration; (0, 0) without one."""
    cache = read_cache()
    last = max(cache.values(), key=lambda c: c["when"], default=None)
    return (last["run_s"], last["startup_s"]) if last else (0.0, 0.0)


def calibrations(configs: dict[str, object], threads: int, say=None) -> dict[str, dict]:
    """{shape key: calibration} for each (key -> representative RunConfig), from the cache or measured now.

    A calibration taken on a busy machine is cached as such and measured again once the machine is
    idle, so a busy spell costs one calibration per shape, not one per plan. say(line), before a
    measurement: what is measured (it takes a worker's start and a run per shape, before any estimate).
    """
    path = cache_path()
    cache = read_cache(path)
    idle = busy() is None
    todo = {k: c for k, c in configs.items() if k not in cache or (idle and cache[k]["busy"])}
    if todo:
        if say is not None:
            say(measuring_line(len(todo), path))
        for key, cal in zip(todo, _measure(list(todo.values()), threads)):
            cache[key] = cal | {"busy": not idle}
        _write_cache(path, cache)
    return {k: cache[k] for k in configs}


def run_estimate(cfg, vocab: int, threads: int, say=None) -> float:
    """Seconds one run of `cfg` takes on this machine (`anatomy train`'s estimate before its first step): its
    shape's calibration, cached or measured now as a plan's are (say: as calibrations'), plus one start-up."""
    sized = cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": vocab})})
    key = shape_key(sized, vocab, threads)
    cal = calibrations({key: sized}, threads, say)[key]
    return run_seconds(sized, cal) + cal["startup_s"]


def measuring_line(shapes: int, path: Path) -> str:
    """What a plan says while it calibrates, before its estimate."""
    return (f"measuring this machine's step times for the estimate: a {N}-step run of each of {shapes} model "
            f"shape{'s' * (shapes > 1)} in a worker (once per shape, cached in {path})...")


def _measure(configs: list, threads: int) -> list[dict]:
    # worker.Worker, not a process pool: an interrupt ends the calibration at once, and the worker
    # never outlives this process (a pool's worker orphaned by a SIGKILL finished its calibration,
    # then waited for work forever on a queue it holds open itself, keeping the resource tracker up).
    from anatomy_cli.sweep.worker import Worker

    jobs = [c.model_dump(mode="json") for c in configs]
    t0 = time.time()
    with Worker() as worker:
        ready, out = worker.call(measure_in_worker, jobs, threads)
    for cal in out:
        cal["startup_s"] = round(ready - t0, 3)
    return out


def measure_in_worker(jobs: list[dict], threads: int) -> tuple[float, list[dict]]:
    """(time the worker was ready, [calibration per config]): one timed run of each config (see above)."""
    import torch

    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.spec.config import RunConfig
    from anatomy_cli.training.run import train

    def run(job: dict, steps: int, evals: int) -> tuple[float, dict]:
        cfg = RunConfig.model_validate(job | {"train": job["train"] | {
            "steps": steps, "eval_interval": steps // evals, "warmup": 0, "keep_checkpoints": []}})  # a budget
        # ladder's stable run keeps checkpoints past these few steps: timing needs none
        with tempfile.TemporaryDirectory(prefix="anatomy-cal-") as tmp:
            t = time.perf_counter()
            summary = train(cfg, Path(tmp) / "run")
            return time.perf_counter() - t, summary

    torch.set_num_threads(threads)
    for job in jobs:  # the corpus is read once per process, as a sweep worker's first run does
        d = job["data"]
        load_corpus(d["source"], d["val_frac"], job["model"]["ctx_len"], d.get("tokenizer"))
    if jobs:
        run(jobs[0], 2, 1)  # warm-up: first-use costs belong to the start-up, not to a shape's steps
    ready, out = time.time(), []
    for job in jobs:
        took, summary = run(job, N, E)
        train_s = summary["step_time_ms"] * N / 1000
        eval_s = max(1e-5, (summary["wall_s"] - train_s) / E)  # the loop's E; step 0's is outside it
        out.append({"step_s": round(max(1e-5, train_s / N), 5), "eval_s": round(eval_s, 5),
                    "run_s": round(max(0.0, took - summary["wall_s"] - eval_s), 4),
                    "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    return ready, out
