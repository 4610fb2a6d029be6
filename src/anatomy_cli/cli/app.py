"""The Typer app every command module registers on: consoles, exit codes, shared options, errors.

Command modules (cli.run, cli.sweep, cli.parts, cli.scale_plan, cli.tools, cli.exams) import this module; it
imports none of them, and cli.main (the entry point) imports them all. Heavy imports (torch, pandas, matplotlib)
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

import codecs
import contextlib
import errno
import functools
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from anatomy_cli.spec.errors import InputError


def _untyped_flags(params: list) -> list:
    """A flag takes no value, so --help shows no type for it (typer's own help would print <bool>)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """Every command of the app: as typer's, with flags shown without a type in --help."""

    def get_params(self, ctx):
        return _untyped_flags(super().get_params(ctx))


# A command whose options include the study's alias flags (spec/knobs.py's ALIASES): click hands every option it does
# not know, and every argument, to the command in order (ctx.args), and knobs.read_args reads them from the table.
ALIAS_CONTEXT = {"ignore_unknown_options": True, "allow_extra_args": True}


class Group(TyperGroup):
    """The app itself: as typer's, with flags (--debug, --install-completion) shown without a type."""

    def get_params(self, ctx):
        return _untyped_flags(super().get_params(ctx))


class App(typer.Typer):
    """typer.Typer whose commands are `Command`s unless a command asks for another class."""

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs):
        return super().command(name, cls=cls or Command, **kwargs)


app = App(
    cls=Group,
    name="anatomy",
    help="Take a language model apart: train small char-level transformers and measure, one component "
    "at a time, how a 2017 Transformer becomes a LLaMA.\n\nExit codes: 0 ok, 1 regression/failed run, "
    "2 bad input, 3 sweep or run directory in use, 130 interrupted (also SIGTERM/SIGHUP), 141 output pipe closed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


class OutputError(OSError):
    """A write to the standard output that failed (`> file` on a full disk, > /dev/full): the command's own
    output is lost, so it fails, saying which stream (a bare write error names no file)."""


STDOUT = "the standard output"


def write_out(text: str) -> None:
    """sys.stdout.write and flush (now: a block-buffered stdout would fail only at exit, exit 120), a failure
    raised as the standard output's (OutputError)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        raise OutputError(err.errno, err.strerror, STDOUT) from None


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """rich's own handling exits 1 (our 'failed run'); raise instead, for handle_errors' pipe rule."""
        self.quiet = True
        raise BrokenPipeError

    def _check_buffer(self) -> None:
        """A failed write to stdout is the command's failure, named (OutputError). One to stderr (2> /dev/full) is
        not: stderr holds progress, warnings and errors, never the command's output, so the command goes on and
        its output and exit code stand (this console goes quiet, and fd 2 points at /dev/null from then on)."""
        try:
            super()._check_buffer()
        except BrokenPipeError:
            raise
        except OSError as err:
            del self._buffer[:]
            if not self.stderr:
                raise OutputError(err.errno, err.strerror, STDOUT) from None
            self.quiet = True
            _silence(2)


class _Environ(Mapping):
    """os.environ as the consoles read it, live: a COLUMNS or LINES that is not a positive number is
    unset, as the shell and shutil.get_terminal_size read it. rich takes COLUMNS=0 (some CI containers
    export it) for a terminal 0 columns wide and prints nothing at all, errors included."""

    SIZES = ("COLUMNS", "LINES")

    def __getitem__(self, key: str) -> str:
        value = os.environ[key]
        if key in self.SIZES and not (value.strip().isdigit() and int(value) > 0):
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k for k in os.environ if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


# User text (paths, spec and component descriptions, error messages) is printed as it is: markup and
# emoji codes are off, so "[/bold]" or ":x:" in a name is never parsed. Styled words use rich Text.
console = _Console(markup=False, emoji=False, _environ=_Environ())
err_console = _Console(stderr=True, markup=False, emoji=False, _environ=_Environ())
# debug: --debug was given. hint: what an interrupted command tells the user (see on_interrupt).
# aborted: a StopFlag has raised KeyboardInterrupt in this command (later signals are let be).
STATE: dict = {"debug": False, "hint": None, "aborted": False, "warned": []}

EXIT_FAILED, EXIT_INPUT, EXIT_LOCKED, EXIT_INTERRUPTED, EXIT_PIPE = 1, 2, 3, 130, 141

RunsDir = Annotated[Path, typer.Option("--runs-dir", help="Where run directories are written.")]
Sets = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Dotted override, e.g. model.pos_type=rope (repeatable).")]
StudySets = Annotated[Optional[list[str]], typer.Option(
    "--set", help="A key of the study spec, e.g. seeds=6, base.train.steps=300, decide.max_seeds=6, margin=0.05, "
    "decide=false (repeatable; after the alias flags, the last one wins).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
Plugins = Annotated[Optional[list[Path]], typer.Option(
    "--plugin", help="A Python file of parts (decorated with @part from anatomy_cli.model.parts) to load first "
    "(repeatable); installed packages' parts (entry points anatomy.parts) load by themselves.", show_default=False)]


def load_parts(plugins: list[Path] | None) -> list[str]:
    """Load --plugin files (PartError, one line, for one that does not load) and the installed packages'
    parts (a package that fails to load is a warning line; the others still load); the paths as loaded."""
    from anatomy_cli.spec import parts

    loaded = parts.load_plugins(plugins or [])
    for line in parts.load_entry_points():
        if line not in STATE["warned"]:
            STATE["warned"].append(line)
            warn(line)
    return [p.path for p in loaded]


def styled(label: str, style: str, rest: str = ""):
    """A styled word followed by plain text (never parsed as markup): styled("error:", "bold red", " ...")."""
    from rich.text import Text

    return Text.assemble((label, style), rest)


def fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    err_console.print(styled("error:", "bold red", f" {message}"), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def warn(message: str) -> None:
    """One line on stderr starting 'warning:': something worth knowing that is not a refusal."""
    err_console.print(styled("warning:", "bold yellow", f" {message}"), highlight=False, soft_wrap=True)


def warn_short_runs(configs) -> None:
    """A warning for runs that end inside their warmup (TrainConfig.warmup_note): once per distinct
    note, with how many of the runs it concerns when not all of them."""
    configs = list(configs)
    notes: dict[str, int] = {}
    for cfg in configs:
        note = cfg.train.warmup_note
        if note:
            notes[note] = notes.get(note, 0) + 1
    for note, n in notes.items():
        warn(note if n == len(configs) else f"{n} of {len(configs)} runs: {note}")


def on_interrupt(hint: Callable[[], str | None]) -> None:
    """Register what an interrupted command tells the user, asked when the interrupt lands: a run
    that was started says how to resume it, wherever the signal caught the command."""
    STATE["hint"] = hint


def _interrupted() -> str:
    hint = STATE["hint"]() if STATE["hint"] else None
    return f"interrupted; {hint}" if hint else "interrupted"


def one_line(text: str) -> str:
    """An exception's text on one line (a pydantic dump or a C++ message can span several)."""
    return " ".join(str(text).split())


def handle_errors(fn):
    """Turn domain exceptions into one-line messages and documented exit codes.

    For the whole command, SIGTERM and SIGHUP stop it as Ctrl-C does (StopFlag(graceful=False)):
    the work unwinds (locks released, workers ended, temp files removed) and the exit is 130. A
    command that can stop cleanly (train, ablate) nests a graceful StopFlag of its own. Library
    warnings (torch, pandas, matplotlib) are not shown unless --debug.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from anatomy_cli.store.lockfile import Locked

        STATE["hint"], STATE["aborted"] = None, False
        if sys.stdout is None:  # fd 1 closed (`>&-`): Python gives no stdout, and every print would fail
            raise fail("standard output is closed; send it to a file or /dev/null (> out.txt) instead")
        try:
            with StopFlag(graceful=False), quiet_warnings():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Locked as err:
            if STATE["debug"]:
                raise
            raise fail(str(err), EXIT_LOCKED) from None
        except KeyboardInterrupt:
            raise fail(_interrupted(), EXIT_INTERRUPTED) from None
        except BrokenPipeError:  # the reader went away (`anatomy sample ... | head`): stop quietly, like cat
            _silence_stdout()
            raise typer.Exit(EXIT_PIPE) from None
        except InputError as err:
            if STATE["debug"]:
                raise
            raise fail(str(err)) from None
        except OSError as err:
            if STATE["debug"]:
                raise
            if isinstance(err, OutputError):  # what stdout still buffers would fail again at exit
                _silence_stdout()
            raise fail(os_error_line(err)) from None
        except UnicodeEncodeError as err:
            if STATE["debug"] or not output_encoding(err):
                raise
            raise fail(encoding_line(err)) from None
        except Exception as err:  # a bug, not bad input: still one line unless --debug
            if interrupt_behind(err):
                raise fail(_interrupted(), EXIT_INTERRUPTED) from None
            if STATE["debug"]:
                raise
            raise fail(f"internal error: {err.__class__.__name__}: {one_line(err)} (rerun with --debug for the "
                       f"traceback)", EXIT_FAILED) from None

    return wrapper


def interrupt_behind(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused `err`: Python 3.11 wraps one that lands in a descriptor's
    __set_name__ (a dataclass being defined while a command's lazy import runs) in a RuntimeError."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def keep_exit_code() -> None:
    """Make `python -m anatomy_cli` end with the exit code the command chose. CPython remembers a
    KeyboardInterrupt that escaped code run by exec() or eval() of a string, even one caught later
    (Python/pythonrun.c, run_eval_code_obj), and a `-m` run then ends by SIGINT instead of exit 130.
    A dataclass defined while the interrupt lands is such code. Each such call first clears the mark,
    so one more, of nothing, clears it."""
    exec("")


def os_error_line(err: OSError) -> str:
    """'No space left on device: runs/x/metrics.jsonl' (the path when the error knows it)."""
    from anatomy_cli.store.runs import file_size_limit

    where = f": {err.filename}" if getattr(err, "filename", None) else ""
    if isinstance(err, (FileExistsError, NotADirectoryError)) and where:  # mkdir met a file where a folder goes
        return f"not a directory (a file is in the way){where}"
    limit = file_size_limit() if err.errno == errno.EFBIG else None
    if limit is not None:  # `ulimit -f` stopped the write (SIGXFSZ is ignored by Python, so write() fails)
        return (f"{err.strerror or 'File too large'}{where} (the file-size limit, ulimit -f, is {limit / 1024:,.0f} "
                f"KiB; raise it or write elsewhere)")
    return f"{err.strerror or one_line(err) or err.__class__.__name__}{where}"


def output_encoding(err: UnicodeEncodeError) -> str | None:
    """The encoding of stdout or stderr when `err` is theirs failing on a character they cannot show."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if encoding and codecs.lookup(encoding).name == codecs.lookup(err.encoding).name:
            return encoding
    return None


def encoding_line(err: UnicodeEncodeError) -> str:
    """One line for output that its encoding cannot show, naming the fix. Not replaced with '?': a
    sample's text and a report's numbers would be changed without a word (the JSON of --json is
    ASCII-escaped and shows in any encoding)."""
    char = err.object[err.start:err.end][:1]
    if "\ud800" <= char <= "\udfff":  # a byte of a file name or setting that was not valid text when read
        return (f"cannot print {ascii(char)}: a name or text read from outside holds bytes that are not valid "
                f"{err.encoding}")
    return (f"the output's encoding ({output_encoding(err)}) cannot show {ascii(char)}; set "
            f"PYTHONIOENCODING=utf-8 (or a UTF-8 locale) to see it")


@contextlib.contextmanager
def quiet_warnings():
    """Library warnings off for a command (shown with --debug): a user sees our messages, not theirs."""
    with warnings.catch_warnings():
        if not STATE["debug"]:
            warnings.simplefilter("ignore")
        yield


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's last flush cannot fail on the closed pipe again."""
    _silence(1)


def _silence(fd: int) -> None:
    """Point `fd` (1 or 2: stdout's or stderr's, if they are the real ones) at /dev/null."""
    stream = sys.stdout if fd == 1 else sys.stderr
    try:
        if stream is None or stream.fileno() != fd:
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real fd (a test runner's capture): nothing to protect
        pass


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False):
    STATE["debug"] = debug


class StopFlag:
    """The first SIGINT, SIGTERM or SIGHUP asks the work to stop cleanly (a run checkpoints at the
    end of its step, a sweep's workers do the same); a second one aborts at once (KeyboardInterrupt).

    graceful=False makes the first signal abort, as Ctrl-C does by default: for work that cannot
    stop cleanly, so that SIGTERM and SIGHUP at least unwind it (locks released, exit 130).
    Flags raise KeyboardInterrupt once per command (STATE["aborted"]): signals after that are let
    be, so the unwinding they started (a lock released, workers joined) is not itself cut short.
    Off the main thread (where Python cannot take signals) it installs nothing.
    """

    def __init__(self, graceful: bool = True):
        self.requested = False
        self.graceful = graceful
        self.previous: dict = {}

    def __enter__(self) -> StopFlag:
        from anatomy_cli.sweep.worker import STOP_SIGNALS

        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        if STATE["aborted"]:
            return
        if self.requested or not self.graceful:
            STATE["aborted"] = True
            raise KeyboardInterrupt
        self.requested = True

    def __call__(self) -> bool:
        return self.requested

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
