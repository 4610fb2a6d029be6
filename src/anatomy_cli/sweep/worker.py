"""One spawned worker process that runs calls one at a time and never outlives its caller (no torch).

    with Worker() as w:
        result = w.call(fn, *args)   # fn(*args) in a clean spawned interpreter; its result or its error

Leaving the block ends the process: politely when the block ends normally, at once (terminate)
when it is left by an exception (Ctrl-C, SIGTERM, SIGHUP turned into KeyboardInterrupt by the
CLI), so an interrupted caller never leaves a worker computing on. A worker whose caller died
without unwinding (SIGKILL) notices and exits by itself (exit_with_parent). The worker ignores
SIGINT and SIGHUP, which a terminal sends to the whole process group: its caller decides, and
ends it. Library warnings are off in the worker, as in the CLI.
"""

from __future__ import annotations

import contextlib
import os
import signal
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
