"""Sweep jobs and the local executor: a Job is one planned run, ready to train anywhere.

plan.py plans runs and hands Jobs to an executor: `execute_local` (this process, or a pool of
spawned processes) or dask_exec.execute_dask (a dask.distributed cluster). Executors import this
module, never plan.py. Events ({"event": "start" | "progress" | "done", "run_id", ...}) reach
the caller through a callback.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from anatomy_cli.spec import parts as registry
from anatomy_cli.spec.config import RunConfig
from anatomy_cli.store import runs
from anatomy_cli.store.summary import RunSummary
from anatomy_cli.sweep.worker import STOP_SIGNALS, signals_deferred

Event = Callable[[dict], None]
Stop = Callable[[], bool]


@dataclass(frozen=True)
class Job:
    """One run to train: its id, resolved config (JSON-able), directory, torch threads, summary extras, and
    the source of its config's plugin files ({path: text}, as the planning process loaded them): a worker
    registers that code before it validates the config, so it trains exactly what was planned, on a
    machine without the files too (spec/parts.py)."""

    run_id: str
    config: dict
    run_dir: str
    threads: int = 1
    extra: dict = field(default_factory=dict)  # RunSummary's carried fields the plan sets: sweep, role, flip
    plugins: dict = field(default_factory=dict)
    branch_of: str = ""  # a budget ladder's decay: the stable run's folder it branches from (training/branch.py)

    def __post_init__(self):
        RunSummary(**self.extra)  # a wrong type is a planning bug: raise now, not in a worker
        unknown = set(self.extra) - set(RunSummary.model_fields)
        if unknown:
            raise ValueError(f"Job.extra: {sorted(unknown)} are not RunSummary fields")

    @property
    def steps(self) -> int:
        return self.config["train"]["steps"]

    def at(self, run_dir: Path | str, config: dict | None = None, threads: int | None = None) -> Job:
        """The same job trained elsewhere (a worker's temp folder, its local corpus copy)."""
        return replace(self, run_dir=str(run_dir), config=config or self.config, threads=threads or self.threads)


def execute_local(jobs: list[Job], workers: int, emit: Event, stop: Stop | None = None, stack: int = 1) -> None:
    """Train jobs in this process (one worker) or in a pool of spawned processes.

    stack > 1: jobs that differ only by seed train as one stacked model, up to `stack` at a time
    (group_jobs, run_group); the unit a worker takes is such a group.
    stop() turning true ends the sweep early but cleanly: runs in flight save a checkpoint and end
    'interrupted' at their next step, runs not started are left untouched, and this returns once
    every worker has finished (none is left running).
    """
    stop = stop or (lambda: False)
    groups = group_jobs(jobs, stack)
    if workers <= 1 or len(groups) <= 1:
        for group in groups:
            if stop():
                return
            for job in group:
                emit({"event": "start", "run_id": job.run_id, "steps": job.steps})
            for job, summary in zip(group, run_group(group, emit, stop)):
                emit({"event": "done", "run_id": job.run_id, "summary": summary})
    else:
        _execute_parallel(groups, workers, emit, stop)


def group_jobs(jobs: list[Job], stack: int) -> list[list[Job]]:
    """Jobs that differ only by seed, in chunks of at most `stack` (1: every job alone), in plan order. A
    budget ladder's decays go with their stable run, after it, as one group trained in order (never stacked;
    a decay whose stable run is already done is a group of its own)."""
    if any(job.branch_of for job in jobs):
        ladders: dict[str, list[Job]] = {}
        for job in jobs:
            ladders.setdefault(job.branch_of or job.run_dir, []).append(job)
        return list(ladders.values())
    if stack <= 1:
        return [[job] for job in jobs]
    by_config: dict[str, list[Job]] = {}
    for job in jobs:
        key = json.dumps({k: v for k, v in job.config.items() if k != "seed"}, sort_keys=True)
        by_config.setdefault(key, []).append(job)
    return [same[i:i + stack] for same in by_config.values() for i in range(0, len(same), stack)]


def run_group(jobs: list[Job], emit: Event | None = None, stop: Stop | None = None) -> list[dict]:
    """Train jobs that differ only by seed: as one stack where the model stacks (training/stacked.py), each
    alone where it cannot (summary stack_note says why) or where they start from different steps
    (a rerun where some seeds completed or stopped at other checkpoints: one stack per step)."""
    if len(jobs) == 1:
        return [run_job(jobs[0], emit, stop)]
    if any(j.branch_of for j in jobs):  # a stable run and its decays, in order: a decay needs its checkpoint
        out = []
        for j in jobs:
            stopped = stop is not None and stop()
            out.append(runs.read_summary(Path(j.run_dir)) or {} if stopped else run_job(j, emit, stop))
        return out
    import torch

    from anatomy_cli.training.stacked import stack_problem, start_step, train_group

    registry.preload(jobs[0].plugins)
    torch.set_num_threads(jobs[0].threads)
    problem = stack_problem(RunConfig.model_validate(jobs[0].config))
    if problem:
        return [run_job(replace(j, extra={**j.extra, "stack_note": problem}), emit, stop) for j in jobs]
    by_step: dict[int | None, list[Job]] = {}
    for job in jobs:
        by_step.setdefault(start_step(Path(job.run_dir)), []).append(job)
    done: dict[str, dict] = {}
    for step, part in by_step.items():
        if step is None or len(part) == 1:
            done.update((j.run_id, run_job(j, emit, stop)) for j in part)
            continue
        ids = {str(Path(j.run_dir)): j.run_id for j in part}
        on_progress = (lambda p: emit({"event": "progress", "run_id": ids[p["run_dir"]], **p})) if emit else None
        try:
            summaries = train_group([RunConfig.model_validate(j.config) for j in part], [Path(j.run_dir) for j in part],
                                    on_progress, stop, [j.extra for j in part], resume=step > 0)
            done.update((j.run_id, s) for j, s in zip(part, summaries))
        except Exception as err:  # noqa: BLE001 - recorded in each unfinished run's summary, the sweep goes on
            for j in part:
                summary = runs.read_summary(Path(j.run_dir))  # None before one is written
                finished = summary is not None and summary.get("status") in runs.DONE_STATES
                done[j.run_id] = summary if finished else record_failure(j, err)
    return [done[j.run_id] for j in jobs]


def run_job(job: Job, emit: Event | None = None, stop: Stop | None = None) -> dict:
    """Train one planned run; any failure becomes a 'failed' summary, never a crashed sweep.

    An interrupted run with a checkpoint continues from it (the same metrics as training it
    through); any other unfinished run is trained from scratch.

    A run another live process is training (RunBusy) is reported as failed but not touched.
    """
    import torch

    from anatomy_cli.training.branch import branch
    from anatomy_cli.training.run import has_checkpoint, resume, train

    torch.set_num_threads(job.threads)
    registry.preload(job.plugins)  # the code it was planned with, before its config names the parts
    cfg = RunConfig.model_validate(job.config)
    run_dir = Path(job.run_dir)
    on_progress = (lambda p: emit({"event": "progress", "run_id": job.run_id, **p})) if emit else None
    try:
        if job.branch_of:  # resumes an interrupted branch itself, sets up again one killed before it began
            return branch(Path(job.branch_of), cfg, run_dir, on_progress, stop, job.extra)
        if runs.run_status(run_dir) == runs.INTERRUPTED and has_checkpoint(run_dir):
            with contextlib.suppress(runs.RunError):  # a changed corpus, a bad checkpoint: start again
                return resume(run_dir, progress=on_progress, stop=stop)
        return train(cfg, run_dir, progress=on_progress, stop=stop, extra_summary=job.extra)
    except Exception as err:  # noqa: BLE001 - recorded in the run's summary, the sweep goes on
        return record_failure(job, err)


def record_failure(job: Job, err: Exception) -> dict:
    """A failed run's summary (written to its folder, unless another live process trains it)."""
    if isinstance(err, runs.RunBusy):
        return RunSummary(status=runs.FAILED, run_id=job.run_id, error=str(err), **job.extra).record()
    run_dir = Path(job.run_dir)
    summary = RunSummary(status=runs.FAILED, run_id=job.run_id, error=f"{err.__class__.__name__}: {err}",
                         **job.extra).record()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / runs.CONFIG).exists():  # so reports list the failed run too
        runs.atomic_write_json(run_dir / runs.CONFIG, job.config)
    runs.atomic_write_json(run_dir / runs.SUMMARY, {**(runs.read_summary(run_dir) or {}), **summary})
    return summary


# ------------------------------------------------------------------ the pool of spawned workers
# Each worker ignores nothing and dies of nothing it can handle: SIGINT, SIGTERM and SIGHUP (a
# terminal's Ctrl-C or hang-up, `kill`, a killpg of the sweep) only ask it to stop, exactly like
# the sweep's own stop event, which the parent sets when it is asked to stop; a worker whose parent
# is gone (the sweep was SIGKILLed) stops too. Stopping means: finish the step, save, end
# 'interrupted'. A worker killed outright still leaves a resumable run (runs.run_status).
# The parent's death reaches a worker as PARENT_DIED from the kernel (worker.die_with_parent): a
# signal of its own, not a STOP_SIGNAL, because the kernel may send it twice (once as the dying
# parent's threads hand the worker on to each other, once when the last goes), which a STOP_SIGNAL
# would count as "asked twice: abort". Its polling thread (worker.exit_with_parent) then exits the
# worker once the run in progress has saved, or at once when it is idle.

_WORKER: dict = {}
PARENT_DIED = getattr(signal, "SIGUSR1", None)


def _init_worker(stop_event, queue, parent: int) -> None:
    import threading
    import warnings

    from anatomy_cli.sweep.worker import die_with_parent, exit_with_parent

    # First, with the parent's pid as the parent knew it: read here (getppid), it would be 1 for a
    # worker whose parent died while it started, which would then never notice, train its runs and
    # wait for work forever. Before the handler below is in place, PARENT_DIED just ends the worker.
    if PARENT_DIED is not None:
        die_with_parent(parent, PARENT_DIED)
    _WORKER.update(stop_event=stop_event, queue=queue, parent=parent, signals=0, orphaned=False,
                   busy=threading.Lock())
    for sig in STOP_SIGNALS:
        signal.signal(sig, _worker_signal)
    if PARENT_DIED is not None:
        signal.signal(PARENT_DIED, _parent_died)
    warnings.simplefilter("ignore")  # library warnings are off, as in the CLI
    # An orphaned worker would wait for work forever (its siblings hold the queue open): once the
    # parent is gone and the run in progress has saved (_worker_stop sees it too), exit.
    threading.Thread(target=exit_with_parent, args=(parent, _WORKER["busy"]), daemon=True).start()


def _worker_signal(signum, frame) -> None:
    _WORKER["signals"] += 1
    if _WORKER["signals"] > 1:  # asked twice: abort now (the run is recorded 'interrupted')
        raise KeyboardInterrupt


def _parent_died(signum, frame) -> None:
    _WORKER["orphaned"] = True  # however often it comes: stop (save), never abort


def _worker_stop() -> bool:
    import os

    return (bool(_WORKER["signals"]) or _WORKER["orphaned"] or _WORKER["stop_event"].is_set()
            or os.getppid() != _WORKER["parent"])


def _worker(group: list[Job]) -> list[dict] | None:
    with _WORKER["busy"]:
        if _worker_stop():  # queued before the sweep was stopped: leave the runs untouched
            return None
        return run_group(group, _WORKER["queue"].put, _worker_stop)


def _execute_parallel(groups: list[list[Job]], workers: int, emit: Event, stop: Stop) -> None:
    import multiprocessing as mp
    import os
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn")  # a clean interpreter per worker: no forked torch thread pools
    # A plain queue and event (no Manager process, which a SIGTERM to the group would kill).
    stop_event, q = ctx.Event(), ctx.Queue()
    lost: list[Job] = []  # runs whose worker died under them (killed: out of memory, SIGKILL)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(stop_event, q, os.getpid())) as pool:
        try:
            with signals_deferred():  # submit spawns the workers: never leave one half-started
                futures = {pool.submit(_worker, group): group for group in groups}
            pending = set(futures)
            started: set[str] = set()
            while pending:
                if stop() and not stop_event.is_set():
                    stop_event.set()
                    for fut in pending:
                        fut.cancel()  # not yet handed to a worker
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(q, emit, started, queue_mod)
                for fut in done:
                    try:
                        summaries = None if fut.cancelled() else fut.result()
                    except BrokenProcessPool:
                        lost.extend(futures[fut])
                        continue
                    for job, summary in zip(futures[fut], summaries or []):
                        emit({"event": "done", "run_id": job.run_id, "summary": summary})
            _drain(q, emit, started, queue_mod)
        finally:
            stop_event.set()  # however this ends (a second Ctrl-C), workers save and stop, then exit
    for job in lost:  # every worker has exited now: a run still 'running' lost its process
        summary = _record_lost(job)
        if summary is not None:
            emit({"event": "done", "run_id": job.run_id, "summary": summary})


def _record_lost(job: Job) -> dict | None:
    """Mark a run whose worker was killed mid-run (SIGKILL, the OOM killer) 'interrupted', with the
    reason: a rerun resumes it from its last checkpoint, as it would a killed `train` (None: it never
    started)."""
    run_dir = Path(job.run_dir)
    summary = runs.read_summary(run_dir) if (run_dir / runs.SUMMARY).exists() else None
    if not summary or summary.get("status") != runs.RUNNING:
        return summary
    summary = {**summary, "status": runs.INTERRUPTED, "owner": None,
               "error": "the worker process died mid-run (killed by a signal or out of memory); rerun to resume it"}
    runs.atomic_write_json(run_dir / runs.SUMMARY, summary)
    return summary


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
