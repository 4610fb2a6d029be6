"""One spawned worker process that runs calls one at a time and never outlives its caller (no torch).

    with Worker() as w:
        result = w.call(fn, *args)   # fn(*args) in a clean spawned interpreter; its result or its error

Leaving the block ends the process: politely when the block ends normally, at once (terminate)
when it is left by an exception (Ctrl-C, SIGTERM, SIGHUP turned into KeyboardInterrupt by the
CLI), so an interrupted caller never leaves a worker computing on. The worker ignores SIGINT and
SIGHUP, which a terminal sends to the whole process group: its caller decides, and ends it.
Library warnings are off in the worker, as in the CLI.

No spawned process outlives its parent, however the parent dies (SIGKILL and the OOM killer
included, which run no handler and no `finally`). Two guards, both armed in every spawned child:

  die_with_parent   first thing our code does in the child: Linux's parent-death signal (prctl
                    PR_SET_PDEATHSIG), sent by the kernel the moment the parent dies, then a check
                    that the parent is still the pid that spawned it: a parent that died earlier
                    (while the child was still importing, before it could ask) makes it exit at
                    once. So a child orphaned at any moment ends by the end of its start-up.
  exit_with_parent  a daemon thread that polls getppid() against that same pid (passed in by the
                    parent, never read in the child, which may already be re-parented) and exits the
                    process: the portable fallback (macOS has no prctl).

The spawn paths, each armed this way:
  Worker            the calibration (calibrate._measure: `scale-plan`, ablate's estimate) and
                    `ablate --time`'s timing pass: parent-death SIGKILL (a call has nothing to save).
  sweep workers     jobs._execute_parallel (`ablate`/`check --workers N`): parent-death SIGUSR1, which
                    a sweep worker takes as a stop request (finish the step, save, end 'interrupted');
                    exit_with_parent then exits it once its run has saved (its `busy` lock), or at
                    once when idle. Not SIGTERM: the kernel may send the parent-death signal twice
                    (once per thread of the dying parent the child is handed on to), and a second
                    SIGTERM means "abort".
  resource tracker  multiprocessing starts it from the parent for any spawn; it exits when every
                    holder of its pipe's write end has: the parent and each spawned child hold one,
                    so it ends with the last child (it was an orphaned child that kept it up).
The parent-death signal follows the *thread* that started the child: every caller here starts and
joins its children in one block of one thread (a pool spawns its workers in submit(), from the
calling thread). `prepare` and the Dask executor start no process (the Dask executor connects to
an existing cluster); torch's own compile workers watch their parent (our worker) themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

# The signals that ask a sweep or a run to stop (save, end 'interrupted', exit 130).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def signals_deferred():
    """A stop signal that arrives inside the block is delivered when the block ends. Starting a
    spawned process is such a block: interrupted half-way, the child reads half its start-up data
    and dies of EOFError with a traceback on the terminal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in arrived:
            signal.raise_signal(signum)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """First thing in a spawned child: ask the kernel to send `sig` once `parent` dies (Linux's
    parent-death signal), then exit at once if it already has (the child was re-parented before the
    request took effect). True where the kernel took the request; False elsewhere (macOS), where
    exit_with_parent's polling is the only guard."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
        except (OSError, AttributeError):  # no glibc (musl, a static build): polling only
            armed = False
    if os.getppid() != parent:
        os._exit(0)
    return armed


class WorkerDied(RuntimeError):
    """The worker process ended without answering (killed by a signal, out of memory)."""


def exit_with_parent(parent: int, busy: threading.Lock | None = None, every: float = 0.5) -> None:
    """Run in a daemon thread of a worker: once `parent` is gone (the worker was re-parented), wait
    for `busy` (the work in progress saving itself) and exit the process."""
    while os.getppid() == parent:
        time.sleep(every)
    if busy is not None:
        busy.acquire()
    os._exit(0)


def _main(conn, parent: int) -> None:
    die_with_parent(parent)  # nothing of a call is worth saving: SIGKILL once the caller is gone
    for sig in (signal.SIGINT, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    warnings.simplefilter("ignore")
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the caller closed its end
            return
        if task is None:
            return
        fn, args = task
        try:
            reply = (True, fn(*args))
        except Exception as err:  # noqa: BLE001 - handed to the caller, which raises it
            reply = (False, err)
        try:
            conn.send(reply)
        except Exception as err:  # noqa: BLE001 - an unpicklable result or error: say what it was
            conn.send((False, WorkerDied(f"{err.__class__.__name__}: {err}")))


class Worker:
    """A spawned process for calls (see the module docstring)."""

    def __init__(self, poll_s: float = 0.1):
        self.poll_s = poll_s

    def __enter__(self) -> Worker:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a clean interpreter: no thread pools or caches of this process
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_main, args=(child, os.getpid()), daemon=True)
        with signals_deferred():
            self.proc.start()
        child.close()
        return self

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.conn.send((fn, args))
        while not self.conn.poll(self.poll_s):
            if not self.proc.is_alive():
                raise WorkerDied(f"the worker process ended without answering (exit code {self.proc.exitcode})")
        ok, value = self.conn.recv()
        if not ok:
            raise value
        return value

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            try:
                self.conn.send(None)
                self.proc.join(timeout=30)
            except OSError:
                pass
        if self.proc.is_alive():
            self.proc.terminate()  # SIGTERM: the worker dies at once (nothing of its work is kept)
            self.proc.join()
        self.conn.close()
