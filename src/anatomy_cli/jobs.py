"""Sweep jobs and the local executor: a Job is one planned run, ready to train anywhere.

sweep.py plans runs and hands Jobs to an executor: `execute_local` (this process, or a pool of
spawned processes) or dask_exec.execute_dask (a dask.distributed cluster). Executors import this
module, never sweep.py. Events ({"event": "start" | "progress" | "done", "run_id", ...}) reach
the caller through a callback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import runs
from .config import RunConfig

Event = Callable[[dict], None]


@dataclass(frozen=True)
class Job:
    """One run to train: its id, resolved config (JSON-able), directory, torch threads, summary extras."""

    run_id: str
    config: dict
    run_dir: str
    threads: int = 1
    extra: dict = field(default_factory=dict)  # written into summary.json: sweep, role, flip

    @property
    def steps(self) -> int:
        return self.config["train"]["steps"]

    def at(self, run_dir: Path | str, config: dict | None = None, threads: int | None = None) -> Job:
        """The same job trained elsewhere (a worker's temp folder, its local corpus copy)."""
        return replace(self, run_dir=str(run_dir), config=config or self.config, threads=threads or self.threads)


def execute_local(jobs: list[Job], workers: int, emit: Event) -> None:
    """Train jobs in this process (one worker) or in a pool of spawned processes."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            emit({"event": "start", "run_id": job.run_id, "steps": job.steps})
            emit({"event": "done", "run_id": job.run_id, "summary": run_job(job, emit)})
    else:
        _execute_parallel(jobs, workers, emit)


def run_job(job: Job, emit: Event | None = None) -> dict:
    """Train one planned run; any failure becomes a 'failed' summary, never a crashed sweep."""
    import torch

    from .train import train

    torch.set_num_threads(job.threads)
    cfg = RunConfig.model_validate(job.config)
    run_dir = Path(job.run_dir)
    on_progress = (lambda p: emit({"event": "progress", "run_id": job.run_id, **p})) if emit else None
    try:
        return train(cfg, run_dir, progress=on_progress, extra_summary=job.extra)
    except Exception as err:  # noqa: BLE001 - recorded in the run's summary, the sweep goes on
        summary = {"status": runs.FAILED, "run_id": job.run_id, "error": f"{err.__class__.__name__}: {err}",
                   **job.extra}
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / runs.CONFIG).exists():  # so reports list the failed run too
            runs.atomic_write_json(run_dir / runs.CONFIG, job.config)
        runs.atomic_write_json(run_dir / runs.SUMMARY, summary)
        return summary


def _queue_emit(queue) -> Event:
    return lambda e: queue.put(e)


def _worker(job: Job, queue) -> dict:
    return run_job(job, _queue_emit(queue))


def _execute_parallel(jobs: list[Job], workers: int, emit: Event) -> None:
    import multiprocessing as mp
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = mp.get_context("spawn")  # a clean interpreter per worker: no forked torch thread pools
    with ctx.Manager() as manager, ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        q = manager.Queue()
        futures = {}
        for job in jobs:
            futures[pool.submit(_worker, job, q)] = job.run_id
        pending = set(futures)
        started: set[str] = set()
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(q, emit, started, queue_mod)
            for fut in done:
                emit({"event": "done", "run_id": futures[fut], "summary": fut.result()})
        _drain(q, emit, started, queue_mod)


def _drain(q, emit: Event, started: set, queue_mod) -> None:
    while True:
        try:
            event = q.get_nowait()
        except queue_mod.Empty:
            return
        if event["run_id"] not in started:
            started.add(event["run_id"])
            emit({"event": "start", "run_id": event["run_id"], "steps": event.get("steps")})
        emit(event)
