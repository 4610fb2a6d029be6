"""The Typer app every command module registers on: consoles, exit codes, shared options, errors.

Command modules (cli_run, cli_sweep, cli_tools, cli_exams) import this module; it imports none of
them, and `cli.py` (the entry point) imports them all. Heavy imports (torch, pandas, matplotlib)
happen inside commands so `anatomy --help` is instant.

Exit codes (stable, for scripts):
  0  success
  1  a check found a regression, or a run failed or diverged
  2  bad input: options, spec, corpus, run directory, weights
  3  the sweep or run directory is in use by another live process
  130 interrupted (Ctrl-C, SIGTERM, SIGHUP); the run or sweep can be resumed
  141 the output pipe closed early (`anatomy sample ... | head`): quiet, as a shell reports SIGPIPE
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from . import runs
from .config import ConfigError

app = typer.Typer(
    name="anatomy",
    help="Take a language model apart: train small char-level transformers and measure, one component "
    "at a time, how a 2017 Transformer becomes a LLaMA.\n\nExit codes: 0 ok, 1 regression/failed run, "
    "2 bad input, 3 sweep or run directory in use, 130 interrupted (also SIGTERM/SIGHUP), 141 output pipe closed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """rich's own handling exits 1 (our 'failed run'); raise instead, for handle_errors' pipe rule."""
        self.quiet = True
        raise BrokenPipeError


console = _Console()
err_console = _Console(stderr=True)
STATE = {"debug": False}

EXIT_FAILED, EXIT_INPUT, EXIT_LOCKED, EXIT_INTERRUPTED, EXIT_PIPE = 1, 2, 3, 130, 141

RunsDir = Annotated[Path, typer.Option("--runs-dir", help="Where run directories are written.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", help="Dotted override, e.g. model.pos_type=rope (repeatable).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


def input_errors() -> tuple[type[BaseException], ...]:
    """Domain exceptions that mean 'bad input': one line, exit 2."""
    from .check import BaselineError
    from .dask_exec import ExecutorError
    from .data import DataError

    errors: list[type[BaseException]] = [ConfigError, runs.RunError, DataError, BaselineError, ExecutorError]
    if "torch" in sys.modules:  # these modules import torch; only present if a command loaded them
        from .model.kv_cache import CacheFullError
        from .model.positions import PositionError
        from .sample import SampleError

        errors += [SampleError, PositionError, CacheFullError]
    return tuple(errors)


def fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    from rich.markup import escape  # a message may hold brackets: anatomy-cli[tb], a [components.X] table

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(fn):
    """Turn domain exceptions into one-line messages and documented exit codes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .lockfile import Locked

        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Locked as err:
            if STATE["debug"]:
                raise
            raise fail(str(err), EXIT_LOCKED) from None
        except KeyboardInterrupt:
            raise fail("interrupted", EXIT_INTERRUPTED) from None
        except BrokenPipeError:  # the reader went away (`anatomy sample ... | head`): stop quietly, like cat
            _silence_stdout()
            raise typer.Exit(EXIT_PIPE) from None
        except input_errors() as err:
            if STATE["debug"]:
                raise
            raise fail(str(err)) from None
        except OSError as err:
            if STATE["debug"]:
                raise
            where = f": {err.filename}" if getattr(err, "filename", None) else ""
            raise fail(f"{err.strerror or err.__class__.__name__}{where}") from None
        except Exception as err:  # a bug, not bad input: still one line unless --debug
            if STATE["debug"]:
                raise
            raise fail(f"internal error: {err.__class__.__name__}: {err} (rerun with --debug for the traceback)",
                       EXIT_FAILED) from None

    return wrapper


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's last flush cannot fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real fd (a test runner's captured stdout): nothing to protect
        pass


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False):
    STATE["debug"] = debug


def safe_dir(path: Path) -> Path:
    """A runs directory that is not a file (it may not exist yet)."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"runs directory is a file: {path}")
    return path


class StopFlag:
    """The first SIGINT, SIGTERM or SIGHUP asks the work to stop cleanly (a run checkpoints at the
    end of its step, a sweep's workers do the same); a second one aborts at once (KeyboardInterrupt).

    graceful=False makes the first signal abort, as Ctrl-C does by default: for work that cannot
    stop cleanly, so that SIGTERM and SIGHUP at least unwind it (locks released, exit 130).
    """

    def __init__(self, graceful: bool = True):
        self.requested = False
        self.graceful = graceful

    def __enter__(self) -> StopFlag:
        import signal

        from .jobs import STOP_SIGNALS

        self.previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested or not self.graceful:
            raise KeyboardInterrupt
        self.requested = True

    def __call__(self) -> bool:
        return self.requested

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
