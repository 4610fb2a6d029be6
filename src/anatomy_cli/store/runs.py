"""The on-disk schema of a run (no torch): paths, atomic writes, status, and reading runs back.

A run directory holds, in the order they are written:
  config.json       the resolved RunConfig (vocab_size filled in), written before training
  metrics.jsonl     one JSON object per line: every step has step, train_loss, grad_norm, lr,
                    tokens (train_loss is the cross-entropy; with train.z_loss > 0 each step
                    also has z_loss, the term added to it; a mixture-of-experts model's steps have
                    moe_aux_loss, its load-balancing loss before train.moe_aux_loss scales it; a
                    dsa model's dsa_indexer_loss, its indexer's KL loss before train.dsa_indexer_loss);
                    evaluation steps add val_loss, elapsed_s and val_bpb (bits per byte:
                    data/batches.py)
  vocab.json        the character vocabulary (a JSON list of characters, index = id), or
  tokenizer.json    the tokenizer of a run whose data.tokenizer is not char (data/tokenizer.py)
  best.safetensors  weights at the best val loss;  last.safetensors  weights at the end (of a
                    finished or stopped run; removed when it resumes)
  resume.pt         the latest checkpoint while the run is unfinished (at every evaluation, or as
                    train.checkpoint_every / checkpoint_minutes say, and when stopped): weights,
                    the best weights when older, optimizer, batch order, RNG and counters in one
                    file replaced atomically; read only through torch.load(weights_only=True);
                    removed once the run completes or diverges (training/trainer.py)
  kept-<step>.pt    resume.pt as it was at each step of train.keep_checkpoints, kept when the run ends: the
                    stable-phase checkpoints a budget ladder's decays branch from (training/branch.py)
  samples.txt       text generated from a fixed prefix, temperature and seed
  summary.json      written last, atomically (schema: summary.RunSummary): status ('completed',
                    'diverged', 'failed', 'interrupted', 'running'), losses, params (total) and
                    active_params (per token), tokens, speed, hardware, cpu_capability,
                    corpus_sha256 (the fingerprint of the training text; resume refuses another),
                    for a prepared folder corpus_files (its files' fingerprint: data/prepared.py),
                    tokenizer and tokenizer_sha256, val_tokens and val_bytes (the fixed val windows'
                    targets and the UTF-8 bytes they stand for) and best_val_bpb, and
                    for a mixture of experts expert_load ([layer][expert] fractions of routed
                    tokens, see train.expert_load)
  .lock             held by the process training the run (lockfile.DirLock); a 'running'
                    summary names that owner, and is read as 'interrupted' once the owner is dead
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from anatomy_cli.spec.config import ANY, hash_neutral, hash_resolved
from anatomy_cli.spec.errors import InputError
from anatomy_cli.store import lockfile
from anatomy_cli.store.summary import RunSummary

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
VOCAB = "vocab.json"
TOKENIZER = "tokenizer.json"  # a run's tokenizer when data.tokenizer is not char, in place of vocab.json
BEST = "best.safetensors"
LAST = "last.safetensors"
RESUME = "resume.pt"
SAMPLES = "samples.txt"
TIMING = "timing.json"  # in a sweep directory, by `ablate --time`: the timing pass's rounds
EVAL = "eval.json"  # optional, by `anatomy eval`: {"val_loss_by_ctx": {"128": 1.52, "512": null}, ...}
PARTS = "parts.json"  # a run whose model uses plugin parts: each one's file, sha256, options and source text
RUN_FILES = (CONFIG, METRICS, VOCAB, TOKENIZER, BEST, LAST, RESUME, SAMPLES, SUMMARY, PARTS)
KEPT = "kept-{step}.pt"  # train.keep_checkpoints: a checkpoint kept for branching (kept_checkpoint)
SWEEP = "sweep.json"  # in a sweep directory: the components its runs were planned with

COMPLETED = "completed"
DIVERGED = "diverged"
FAILED = "failed"
INTERRUPTED = "interrupted"
RUNNING = "running"
# Final states: a sweep skips a run in one of these (a diverged run is a result, not an error).
DONE_STATES = (COMPLETED, DIVERGED)

# Fields of metrics.jsonl that measure time, not learning; determinism compares the rest.
TIMING_KEYS = ("elapsed_s",)


class RunError(InputError):
    """A run directory that is missing, incomplete or corrupt."""


def umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask() alone must set one)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and restore at once (a brief race with other threads)
    os.umask(old)
    return old


def normal_mode(target: int | str | Path, directory: bool = False) -> None:
    """Give a mkstemp file (0600) or mkdtemp folder (0700) the mode open()/mkdir() would: 0666/0777 minus umask."""
    mode = (0o777 if directory else 0o666) & ~umask()
    if isinstance(target, int):
        os.fchmod(target, mode)
    else:
        os.chmod(target, mode)


@contextlib.contextmanager
def writing(path: Path):
    """Whatever fails while writing `path` inside this block is an OSError naming it: a bare write()
    error names no file, safetensors says "os error 28" in its own words, and torch.save a full
    disk as "unexpected pos" (a RuntimeError) or not at all, so the CLI could not say which file or
    why. A failure of another kind on a full filesystem is reported as the full disk it is, and one
    whose file (or its temp copy) stopped at the file-size limit (`ulimit -f`) as that limit (EFBIG)."""
    try:
        yield
    except OSError as err:
        if err.filename is None or str(err.filename).endswith(".tmp"):  # name the file, not its temp copy
            err.filename = str(path)
        raise
    except Exception as err:
        said = re.search(r"os error (\d+)", str(err))  # safetensors' (Rust's) words for an errno
        code = int(said.group(1)) if said else errno.ENOSPC if _disk_full(Path(path), err) \
            else errno.EFBIG if _at_size_limit(Path(path)) else None
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from err


def file_size_limit() -> int | None:
    """The process's file-size limit in bytes (`ulimit -f`; a write past it fails with EFBIG, since
    Python ignores SIGXFSZ); None when there is none."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _at_size_limit(path: Path) -> bool:
    """`path`, or a temp copy beside it (.NAME.*.tmp), has reached the file-size limit."""
    limit = file_size_limit()
    if limit is None:
        return False
    try:
        return any(p.stat().st_size >= limit for p in [path, *path.parent.glob(f".{path.name}.*.tmp")] if p.is_file())
    except OSError:
        return False


def _disk_full(path: Path, err: Exception) -> bool:
    if "os error 28" in str(err) or os.strerror(errno.ENOSPC) in str(err):
        return True
    try:
        return os.statvfs(path.parent).f_bavail == 0
    except (OSError, AttributeError):  # no statvfs (Windows) or no folder
        return False


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same folder, fsync, then rename: readers never see half a file,
    and a write that fails (a full disk, an interrupt) leaves the old file as it was and no temp."""
    path = Path(path)
    with writing(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            normal_mode(fd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def append_text(path: Path, text: str, durable: bool = False) -> None:
    """Append to a log (metrics.jsonl), fsynced when `durable`; a failed write names the file (a torn
    last line is skipped when read back: read_metrics)."""
    with writing(path), open(path, "a", encoding="utf-8") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"missing {Path(path).name} in {Path(path).parent}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunError(f"corrupt {Path(path).name} in {Path(path).parent}: {err}") from None
    except (RecursionError, ValueError) as err:  # nesting past the recursion limit, a 5,000-digit integer
        raise RunError(f"corrupt {Path(path).name} in {Path(path).parent}: {err.__class__.__name__}: "
                       f"{str(err)[:200]}") from None


def kept_checkpoint(run_dir: Path, step: int) -> Path:
    """The checkpoint a run kept at `step` (train.keep_checkpoints): run_dir/kept-<step>.pt."""
    return Path(run_dir) / KEPT.format(step=int(step))


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """Every kept-<step>.pt of a run folder (a fresh start removes them with the rest of an attempt)."""
    return sorted(Path(run_dir).glob(KEPT.format(step="*")))


def drop_temp_files(run_dir: Path) -> None:
    """Remove the temp files of atomic writes that a killed process left in a run folder (at most one each)."""
    for name in (*RUN_FILES, KEPT.format(step="*")):
        for tmp in Path(run_dir).glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def json_line(row: dict) -> str:
    """One metrics.jsonl line; a diverged loss is written as NaN/Infinity (Python's json reads them)."""
    return json.dumps(row, allow_nan=True) + "\n"


# Fields a reader may do arithmetic on: a value of another type is a corrupt file, not a crash later.
METRIC_INTS = ("step", "tokens")
METRIC_FLOATS = ("train_loss", "val_loss", "grad_norm", "lr", "elapsed_s", "z_loss", "moe_aux_loss",
                 "dsa_indexer_loss", "val_bpb")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:  # NaN and Infinity count: a diverged loss is written as one
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def field_problem(row: dict, ints: tuple[str, ...], floats: tuple[str, ...]) -> str | None:
    """'val_loss is "abc", not a number' for the first field of the wrong type (None is allowed)."""
    for keys, ok, kind in ((ints, _is_int, "an integer"), (floats, _is_float, "a number")):
        for key in keys:
            value = row.get(key)
            if value is not None and not ok(value):
                return f"{key} is {json.dumps(value)[:40]}, not {kind}"
    return None


def read_config(run_dir: Path) -> dict:
    """config.json as a dict whose sections are dicts (its values are validated by RunConfig where used)."""
    path = Path(run_dir) / CONFIG
    data = read_json(path)
    if not isinstance(data, dict):
        raise RunError(f"corrupt {CONFIG} in {run_dir}: not a JSON object")
    for section in ("model", "train", "data"):
        if not isinstance(data.get(section, {}), dict):
            raise RunError(f"corrupt {CONFIG} in {run_dir}: '{section}' is not a table")
    return data


def read_metrics(run_dir: Path) -> list[dict]:
    """Every line of metrics.jsonl; a torn last line from a crash is ignored, any other bad line is a RunError."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise RunError(f"corrupt {METRICS} in {run_dir}: not UTF-8 text") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # torn by a crash mid-write
            raise RunError(f"corrupt {METRICS} in {run_dir}: line {number} is not JSON") from None
        problem = "not a JSON object" if not isinstance(row, dict) else (
            "no step" if "step" not in row else field_problem(row, METRIC_INTS, METRIC_FLOATS))
        if problem:
            raise RunError(f"corrupt {METRICS} in {run_dir}: line {number}: {problem}")
        rows.append(row)
    return rows


def read_summary(run_dir: Path) -> dict | None:
    """summary.json as its JSON object (None before one is written), validated by summary.RunSummary:
    a non-object or a field of the wrong type is a RunError; fields of a newer version pass through."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        return None
    data = read_json(path)
    problem = RunSummary.check(data)
    if problem:
        raise RunError(f"corrupt {SUMMARY} in {run_dir}: {problem}")
    return data


class FileModel(BaseModel):
    """A file the tool wrote earlier and reads back (eval.json here; a sweep's timing.json, a CI baseline
    and a results file in report/): checked whole before any of it is used, so a wrong type, a negative
    count or a non-finite number is one line naming the file and the field (schema_problem), never a
    crash later. Strict (a string is not a number, true is not an integer; an integer is a number), no
    NaN or infinity, and keys a model does not know are kept (extra="allow": a newer writer's)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)


def read_record(root: Path, name: str, model: type[FileModel]) -> FileModel | None:
    """root/name checked whole against `model` (a study's typed record: decide.json, tune.json), or None
    when the study has none; a corrupt one is one RunError line naming the file and the field."""
    path = Path(root) / name
    if not path.is_file():
        return None
    try:
        return model.model_validate(read_json(path))
    except ValidationError as err:
        raise RunError(f"corrupt {name} in {root}: {schema_problem(err)}") from None


def write_record(root: Path, name: str, record: FileModel) -> None:
    """root/name, atomically; root is made if it is new (a study's plan is written before its first run)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(root) / name, record.model_dump(mode="json"))


def schema_problem(err: ValidationError, keyed: tuple[str, ...] = ()) -> str:
    """'ends.reference.mean: Input should be a valid number': where a FileModel's first problem is, and
    what it is; a key of a table named in `keyed` is shown as ['key'], an item of a list as [i]."""
    e = err.errors(include_url=False)[0]
    where, parent = "", None
    for part in e["loc"]:
        if part == "[key]":  # the table's key itself is at fault: the path already names it
            continue
        if isinstance(part, int):
            where += f"[{part}]"
        else:
            where += f"[{part!r}]" if parent in keyed else f".{part}"
            parent = part
    what = {"model_type": "Input should be a valid dictionary"}.get(e["type"], e["msg"])
    if e["type"] == "value_error":  # a validator's own words, without pydantic's 'Value error, '
        what = str(e["ctx"]["error"])
    return f"{where.lstrip('.')}: {what}" if where else ("not a JSON object" if e["type"] == "model_type" else what)


def _ctx_length(key: str) -> str:
    if not re.fullmatch(r"[1-9][0-9]*", key):
        raise ValueError("not a context length (a whole number > 0)")
    return key


def _loss(value: float) -> float:
    if value < 0:  # NaN passes: a length whose loss overflowed was measured, not corrupted
        raise ValueError("a loss is never negative")
    return value


CtxLength = Annotated[str, AfterValidator(_ctx_length)]


class EvalFile(FileModel):
    """eval.json, as `anatomy eval` writes it (exams/lengths.py): the loss at each context length (null
    where it could not be measured, with a note saying why) and the settings it was measured with."""

    model_config = ConfigDict(allow_inf_nan=True)

    val_loss_by_ctx: dict[CtxLength, Annotated[float, AfterValidator(_loss)] | None] = {}
    notes: dict[CtxLength, str] = None
    ctx_len: Annotated[int, Field(ge=1)] = None
    pos_type: str = None
    label: str = None
    weights: str = None
    batch_size: Annotated[int, Field(ge=1)] = None
    batches: Annotated[int, Field(ge=1)] = None
    dtype: str = None


def read_ctx_losses(path: Path) -> dict[int, float | None]:
    """eval.json's val_loss_by_ctx as {context length: loss, None where it could not be measured}, the
    file checked whole (EvalFile) first."""
    data = read_json(path)
    corrupt = f"corrupt {Path(path).name} in {Path(path).parent}"
    by_ctx = data.get("val_loss_by_ctx", {}) if isinstance(data, dict) else None
    if not isinstance(by_ctx, dict):
        raise RunError(f"{corrupt}: val_loss_by_ctx is not a table")
    try:
        EvalFile.model_validate(data)
    except ValidationError as err:
        raise RunError(f"{corrupt}: {schema_problem(err, ('val_loss_by_ctx', 'notes'))}") from None
    return {int(n): loss for n, loss in by_ctx.items()}


def runs_folder(path: Path) -> Path:
    """A runs directory that is not a file (it may not exist yet)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"runs directory is a file: {path}")
    return path


def run_status(run_dir: Path) -> str | None:
    """The summary's status; 'running' only while its owner lives (a killed run is 'interrupted')."""
    try:
        summary = read_summary(run_dir)
    except RunError:
        return None
    return status_of(summary) if isinstance(summary, dict) else None


def status_of(summary: dict) -> str | None:
    """A summary's status, with 'running' only while its owner lives (a killed run: 'interrupted')."""
    status = summary.get("status")
    if status == RUNNING and not lockfile.alive(summary.get("owner")):
        return INTERRUPTED
    return status


class RunBusy(lockfile.Locked):
    """Another live process is training this run directory."""


class RunLock(lockfile.DirLock):
    """run_dir/.lock, held by whoever trains the run (train, resume, a sweep's worker)."""

    error = RunBusy

    def __init__(self, run_dir: Path):
        super().__init__(run_dir, "run directory")


def check_replace(run_dir: Path, overwrite: bool) -> None:
    """Refuse to train into a folder of other runs (a sweep or runs directory: its report would
    break), and into any non-empty folder (a finished run, other files) unless overwrite."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    if next(run_dir.glob(f"*/{CONFIG}"), None) or next(run_dir.glob(f"*/*/{CONFIG}"), None):
        raise RunError(f"{run_dir} holds other runs (a sweep or runs directory); train into a new directory")
    entries = [p for p in run_dir.iterdir() if not p.name.startswith(lockfile.LOCK)]
    if not entries or overwrite:
        return
    if is_run_dir(run_dir):
        status = run_status(run_dir) or "unfinished"
        hint = f" or resume it with --resume {run_dir}" if status == INTERRUPTED else ""
        raise RunError(f"{run_dir} already holds a {status} run; pass --overwrite to replace it{hint}")
    raise RunError(f"{run_dir} is not empty; pass --overwrite to train into it anyway")


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).is_file()


def find_runs(root: Path) -> list[Path]:
    """All run directories under root (root itself may be one), sorted by path. A run directory
    inside another one is refused: a run folder holds one run (train and ablate refuse to make one)."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    found = sorted(p.parent for p in root.rglob(CONFIG) if "report" not in p.parent.relative_to(root).parts)
    for run_dir in found:
        outer = enclosing_run(run_dir, below=root)
        if outer is not None:
            raise RunError(f"{run_dir} is inside the run directory {outer}: a run folder holds one run; move it out")
    return found


def enclosing_run(path: Path, below: Path | None = None) -> Path | None:
    """The run directory that holds `path` (path itself excluded; only folders under `below`)."""
    path = Path(path)
    for parent in path.parents:
        if below is not None and parent == Path(below) or parent == parent.parent:
            return None
        if is_run_dir(parent):
            return parent
    return None


def check_placement(path: Path, what: str, option: str) -> None:
    """Refuse to put a run, a sweep or a prepared corpus (`what`, placed by `option`) into or inside a run
    folder or a sweep folder (refuse_inside_runs); a run may go where a run is (train replaces it: that is
    check_replace's question) and a sweep where its sweep is (ablate resumes it)."""
    refuse_inside_runs(path, option, f"{what} directory", itself=what if what in ("run", "sweep") else None)


# ----------------------------------------------------------------- where a command may write (issue #30)
# Every command that writes checks its paths here before it writes anything: refuse_inside_runs for
# each path (the one rule on run and sweep folders), then refuse_replacing for a file it writes, or
# refuse_foreign for a folder it writes files into. Each refusal is a RunError: one line, exit 2.

# Beside config.json, what training writes into a run folder from its start (an exported Hugging Face
# folder has a config.json and a vocab.json too, and none of these).
RUN_MARKS = (METRICS, SUMMARY, RESUME, lockfile.LOCK)
SMALL_JSON = 1 << 26  # bytes: a file this command may replace is a small JSON file; a larger one is not read


def holds_run(folder: Path) -> bool:
    """A run folder: a config.json with the metrics, summary, checkpoint or lock of training beside it."""
    folder = Path(folder)
    return (folder / CONFIG).is_file() and any((folder / name).exists() for name in RUN_MARKS)


def by_prefix(path: Path) -> Path:
    """`path` itself where it exists; else the one run folder beside it whose name starts with its name (a unique
    prefix of a run id: runs/demo/llama-s1337 for runs/demo/llama-s1337-9d1fc10a); a prefix of several is a
    one-line RunError naming them; no match: `path` unchanged (its caller says it is not found)."""
    path = Path(path)
    if path.exists() or not path.name or not path.parent.is_dir():
        return path
    try:
        found = sorted(c for c in path.parent.iterdir() if c.name.startswith(path.name) and holds_run(c))
    except OSError:
        return path
    if len(found) > 1:
        shown = ", ".join(c.name for c in found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
        raise RunError(f"{path} is a prefix of {len(found)} runs: {shown}; give more of the run id")
    return found[0] if found else path


def holds_sweep(folder: Path) -> bool:
    """A sweep folder: it holds sweep.json, timing.json or a sweep's .lock (one naming its owner as DirLock
    does: other tools' lock files, pytest's among them, hold a bare pid), or (a list design writes no
    sweep.json) runs whose summaries name it as their sweep."""
    folder = Path(folder)
    if holds_run(folder):
        return False
    if (folder / SWEEP).is_file() or (folder / TIMING).is_file():
        return True
    if "pid" in (json_object(folder / lockfile.LOCK) or {}):
        return True
    try:
        children = list(folder.iterdir())
    except OSError:  # no such folder, not a folder, not readable
        return False
    for child in children:
        summary = json_object(child / SUMMARY) if holds_run(child) else None
        if summary is not None:
            return summary.get("sweep") == folder.name
    return False


def refuse_inside_runs(path: Path, option: str, what: str, own: Path | None = None,
                       itself: str | None = None) -> None:
    """The one rule on run and sweep folders for a command that writes `what` ('results file') at `path`
    (given by `option`): not a run or sweep folder, nor anywhere inside one, whose files it would replace
    or whose report would read it, unless path is `own` or inside it: the command's own output there
    (report SWEEP's SWEEP/report). itself='run': path may be a run folder (train replaces one under
    check_replace's rule); itself='sweep': a sweep folder (ablate resumes one). Symlinks are followed."""
    target = Path(path).resolve()
    if own is not None and (target == Path(own).resolve() or Path(own).resolve() in target.parents):
        return
    for folder in (target, *target.parents):
        kind = "run" if holds_run(folder) else "sweep" if holds_sweep(folder) else None
        if kind is None or (folder == target and kind == itself):
            continue
        if folder == target:
            raise RunError(f"{path} is a {kind} directory, not {_a(what)}; choose another {option}")
        if kind == "run":
            raise RunError(f"{path} is inside the run directory {folder}: a run folder holds one run; choose another "
                           f"{option}")
        why = (f", whose report would count the {itself} as its own" if itself
               else ": only its runs and its report write there")
        raise RunError(f"{path} is inside the sweep directory {folder}{why}; choose another {option}")


def run_below(folder: Path) -> Path | None:
    """The first run folder (holds_run) anywhere below `folder`, itself left out; None when none."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    return next((c.parent for c in folder.rglob(CONFIG) if c.parent != folder and holds_run(c.parent)), None)


def refuse_holding_runs(folder: Path, option: str, what: str) -> None:
    """A folder holding runs (a runs directory, a sweep, with or without its sweep.json) is never one
    that a command writes `what` into, --overwrite or not: a config.json there would make `report`
    read the folder as one run and pass over the runs in it (find_runs)."""
    inside = run_below(folder)
    if inside is not None:
        raise RunError(f"{folder} holds runs ({inside.relative_to(folder)}), so it is not {_a(what)}; choose another "
                       f"{option}")


def refuse_corpus_overlap(sources, out: Path, option: str) -> None:
    """Before anything is written: a run or sweep folder (`out`, from `option`) is never inside a folder
    corpus it trains on (each finished run's samples.txt, and later report.md, would join the next run's
    corpus), and a corpus is never a run or sweep folder, nor inside one (it changes as runs are written).
    `sources`: each data.source of the plan (None, the default corpus, and hf: names are neither)."""
    target = Path(out).resolve()
    for source in dict.fromkeys(sources):
        if source is None or str(source).startswith("hf:"):
            continue
        corpus = Path(source).resolve()
        if corpus.is_dir() and (target == corpus or corpus in target.parents):
            raise RunError(f"{out} is inside the corpus folder {source}: its runs' files would join the corpus "
                           f"the next run trains on; choose a {option} outside it")
        for folder in (corpus, *corpus.parents):
            kind = "run" if holds_run(folder) else "sweep" if holds_sweep(folder) else None
            if kind is not None:
                where = "is" if folder == corpus else f"is inside the {kind} directory {folder}, which is"
                raise RunError(f"the corpus {source} {where} a {kind} directory: its text changes as runs and "
                               f"reports are written; train on a copy, or a prepared folder (anatomy prepare)")
        held = next((p.parent for p in corpus.rglob(CONFIG) if holds_run(p.parent)), None) if corpus.is_dir() else None
        if held is not None:  # a runs folder: its .txt files are the runs' samples, not a corpus
            raise RunError(f"the corpus {source} is a folder of runs (it holds the run {held.relative_to(corpus)}): "
                           f"its .txt files are their samples, not a corpus; give data.source a text file, a folder "
                           f"of text, or a prepared folder")


def refuse_replacing(path: Path, option: str, what: str, ours: Callable[[Path], bool],
                     given: str | None = None) -> None:
    """A command that writes one file (`what`, at `path` from `option`) replaces an existing file only
    where ours(path) says it is one such a command wrote. A folder, or a path typed with a trailing '/'
    (`given`: as typed), is refused, never written as a file of its name."""
    path, shown = Path(path), given or str(path)
    if shown.endswith(("/", os.sep)) or path.is_dir():
        raise RunError(f"{shown} is a directory; {option} takes the path of the {what} itself")
    if os.path.lexists(path) and not path.is_file():
        raise RunError(f"{path} is not a regular file; {option} replaces only {_a(what)}")
    if path.is_file() and not ours(path):
        raise RunError(f"{path} exists and is not {_a(what)}; {option} replaces only {_a(what)}: choose another "
                       f"path, or remove the file first")


def refuse_foreign(folder: Path, option: str, what: str, ours: Callable[[Path], bool],
                   writes: Callable[[str], bool], only: bool = False) -> None:
    """A command that writes files (those writes(name) is true of) into a folder (`what`, from `option`)
    writes into an existing folder only where ours(folder) says such a command wrote it, or where it
    would replace nothing: the folder holds no file of those names (only=True: nothing else at all, as
    a prepared corpus folder, which its meta.json would turn into one, must; hidden files aside)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise RunError(f"not a directory (a file is in the way): {folder}")
    if not folder.is_dir() or ours(folder):
        return
    for entry in sorted(folder.iterdir()):
        if only and not writes(entry.name) and not entry.name.startswith("."):
            raise RunError(f"{folder} is not {_a(what)} but holds {entry.name}; it is written only into a new or "
                           f"empty folder or {_a(what)}: choose another {option}")
        if not only and writes(entry.name):
            raise RunError(f"{folder} is not {_a(what)} but holds {entry.name}, which writing one would replace; "
                           f"choose another {option}")


def json_object(path: Path) -> dict | None:
    """A small JSON file's object; None for anything else (no such file, not a regular file, too large, not
    JSON or not an object): what a command reads of a file to tell whether it wrote it."""
    path = Path(path)
    try:
        if not path.is_file() or path.stat().st_size > SMALL_JSON:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


SLUG_RE = re.compile(r"[^A-Za-z0-9_.+=-]+")


def slugify(text: str) -> str:
    """A path-safe piece of a run id: no separators, no '..', never empty."""
    slug = SLUG_RE.sub("-", text).strip("-.") or "run"
    return slug[:80]


def config_hash(config: dict) -> str:
    """A short hash of a resolved config; fields marked config.NEW are left out at their default, those
    marked config.NO_RESULT at any value; a derived size whose rule changed is hashed at its value
    (config.hash_resolved)."""
    blob = json.dumps(_without(hash_resolved(config), hash_neutral()), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def _without(config: dict, neutral: dict) -> dict:
    out = {}
    for key, value in config.items():
        rule = neutral.get(key, _KEEP)
        if isinstance(rule, dict) and isinstance(value, dict):
            out[key] = _without(value, rule)
        elif rule is _KEEP or isinstance(rule, dict) or (rule != ANY and value != rule):
            out[key] = value
    return out


_KEEP = object()


def run_id(slug: str, seed: int, config: dict) -> str:
    """Readable slug + seed + short hash of the resolved config: stable across calls."""
    return f"{slugify(slug)}-s{seed}-{config_hash(config)}"


def safe_child(root: Path, name: str) -> Path:
    """root/name, refusing names that would escape root."""
    root = Path(root).resolve()
    child = (root / name).resolve()
    if child.parent != root:
        raise RunError(f"run name {name!r} would escape {root}")
    return child
