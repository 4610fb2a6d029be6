"""Plan estimates from this machine's measured times: a short calibration, cached (no torch here).

A FLOP count alone says 1 s for a toy study that takes 27 s: small runs are dominated by what is
not matrix multiplication (Python per step, evaluations, samples, checkpoints, start-up). So each
shape class of a plan (model size, context, batch, vocab, threads, device, torch version) is timed
once, in a spawned worker that trains exactly as a sweep's worker does (train.train into a scratch
folder), three short runs:
  A  k steps, 2 evaluations      B  2k steps, 2 evaluations      C  k steps, 3 evaluations
  step_s = (B - A) / k,  eval_s = C - A,  run_s = A - k step_s - 2 eval_s  (build, samples, files)
and startup_s is the worker's start (interpreter, torch import, corpus). A run of the class is then
  run_s + steps x step_s + evaluations x eval_s
with step and evaluation scaled by the run's FLOPs per token against the calibrated config's, and
a plan is its runs packed onto the workers, longest first, plus one start-up per worker.

The cache is CACHE_DIR/calibration.json ($ANATOMY_CACHE, else $XDG_CACHE_HOME/anatomy, else
~/.cache/anatomy). A calibration taken while the machine was busy (load average above its cores) is
marked so and taken again when the machine is idle; busy() lets a plan say the machine is busy
instead of hiding it in the estimate.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path

K = 10  # steps of calibration run A


def cache_path() -> Path:
    root = os.environ.get("ANATOMY_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anatomy"
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
    return json.dumps({"torch": _torch_version(), "device": t.device, "threads": threads, "d_model": m.d_model,
                       "n_layer": m.n_layer, "n_head": m.n_head, "ctx_len": m.ctx_len, "vocab": vocab,
                       "batch": t.batch_size, "eval_batches": t.eval_batches, "sample_len": t.sample_len,
                       "dtype": t.dtype, "compile": t.compile}, sort_keys=True)


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


def cached_overheads() -> tuple[float, float]:
    """(per-run seconds, start-up seconds) of the most recent cached calibration; (0, 0) without one."""
    try:
        cache = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return 0.0, 0.0
    last = max(cache.values(), key=lambda c: c.get("when", ""), default=None)
    return (last["run_s"], last["startup_s"]) if last else (0.0, 0.0)


def calibrations(configs: dict[str, object], threads: int) -> dict[str, dict]:
    """{shape key: calibration} for each (key -> representative RunConfig), from the cache or measured now.

    A calibration taken on a busy machine is cached as such and measured again once the machine is
    idle, so a busy spell costs one calibration per shape, not one per plan.
    """
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    idle = busy() is None
    todo = {k: c for k, c in configs.items() if k not in cache or (idle and cache[k].get("busy"))}
    if todo:
        for key, cal in zip(todo, _measure(list(todo.values()), threads)):
            cache[key] = cal | {"busy": not idle}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    return {k: cache[k] for k in configs}


def _measure(configs: list, threads: int) -> list[dict]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    jobs = [c.model_dump(mode="json") for c in configs]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        ready, out = pool.submit(measure_in_worker, jobs, threads).result()
    for cal in out:
        cal["startup_s"] = round(ready - t0, 3)
    return out


def measure_in_worker(jobs: list[dict], threads: int) -> tuple[float, list[dict]]:
    """(time the worker was ready, [calibration per config]): runs A, B, C of each config (see above)."""
    import torch

    from anatomy_cli.config import RunConfig
    from anatomy_cli.data import load_corpus
    from anatomy_cli.train import train

    torch.set_num_threads(threads)
    for job in jobs:  # the corpus is read once per process, as a sweep worker's first run does
        d = job["data"]
        load_corpus(d["source"], d["val_frac"], job["model"]["ctx_len"])
    ready, out = time.time(), []
    for job in jobs:
        took = {}
        for name, steps, interval in (("A", K, K), ("B", 2 * K, 2 * K), ("C", K, K // 2)):
            cfg = RunConfig.model_validate(job | {"train": job["train"] | {"steps": steps, "eval_interval": interval,
                                                                            "warmup": 0}})
            with tempfile.TemporaryDirectory(prefix="anatomy-cal-") as tmp:
                t = time.perf_counter()
                train(cfg, Path(tmp) / "run")
                took[name] = time.perf_counter() - t
        step_s = max(1e-4, (took["B"] - took["A"]) / K)
        eval_s = max(1e-4, took["C"] - took["A"])
        out.append({"step_s": round(step_s, 5), "eval_s": round(eval_s, 5),
                    "run_s": round(max(0.0, took["A"] - K * step_s - 2 * eval_s), 4),
                    "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    return ready, out
