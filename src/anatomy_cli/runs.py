"""The on-disk schema of a run (no torch): paths, atomic writes, status, and reading runs back.

A run directory holds, in the order they are written:
  config.json       the resolved RunConfig (vocab_size filled in), written before training
  metrics.jsonl     one JSON object per line: every step has step, train_loss, grad_norm, lr,
                    tokens (train_loss is the cross-entropy; with train.z_loss > 0 each step
                    also has z_loss, the term added to it); evaluation steps add val_loss, elapsed_s
  vocab.json        the character vocabulary (a JSON list of characters, index = id)
  best.safetensors  weights at the best val loss;  last.safetensors  weights at the end
  resume.pt         optimizer/RNG/step state of an interrupted run (torch.load(weights_only=True))
  samples.txt       text generated from a fixed prefix, temperature and seed
  summary.json      written last, atomically: status ('completed', 'diverged', 'failed',
                    'interrupted', 'running'), losses, params, tokens, speed, hardware, and
                    corpus_sha256 (the fingerprint of the training text; resume refuses another)
  .lock             held by the process training the run (lockfile.DirLock); a 'running'
                    summary names that owner, and is read as 'interrupted' once the owner is dead
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from . import lockfile

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
VOCAB = "vocab.json"
BEST = "best.safetensors"
LAST = "last.safetensors"
RESUME = "resume.pt"
SAMPLES = "samples.txt"
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


class RunError(ValueError):
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


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + rename, so readers never see half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        normal_mode(fd)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"missing {Path(path).name} in {Path(path).parent}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RunError(f"corrupt {Path(path).name} in {Path(path).parent}: {err}") from None


def json_line(row: dict) -> str:
    """One metrics.jsonl line; a diverged loss is written as NaN/Infinity (Python's json reads them)."""
    return json.dumps(row, allow_nan=True) + "\n"


# Fields a reader may do arithmetic on: a value of another type is a corrupt file, not a crash later.
SUMMARY_INTS = ("params", "best_step", "steps_done", "tokens_seen", "peak_mem_bytes", "threads", "diverged_at")
SUMMARY_FLOATS = ("best_val_loss", "final_val_loss", "bits_per_char", "tokens_per_s", "step_time_ms", "wall_s")
SUMMARY_STRINGS = ("status", "run_id", "label", "error", "device", "hardware", "torch_version")
METRIC_INTS = ("step", "tokens")
METRIC_FLOATS = ("train_loss", "val_loss", "grad_norm", "lr", "elapsed_s")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:  # NaN and Infinity count: a diverged loss is written as one
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def field_problem(row: dict, ints: tuple[str, ...], floats: tuple[str, ...], strings: tuple[str, ...] = ()) -> str | None:
    """'best_val_loss is "abc", not a number' for the first field of the wrong type (None is allowed)."""
    for keys, ok, kind in ((ints, _is_int, "an integer"), (floats, _is_float, "a number"),
                           (strings, lambda v: isinstance(v, str), "a string")):
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
    """summary.json (None before one is written); a non-object or a field of the wrong type is a RunError."""
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        return None
    data = read_json(path)
    problem = "not a JSON object" if not isinstance(data, dict) else field_problem(
        data, SUMMARY_INTS, SUMMARY_FLOATS, SUMMARY_STRINGS)
    if problem:
        raise RunError(f"corrupt {SUMMARY} in {run_dir}: {problem}")
    return data


def read_ctx_losses(path: Path) -> dict[int, float | None]:
    """eval.json's val_loss_by_ctx as {context length: loss, None where it could not be measured}."""
    data = read_json(path)
    by_ctx = data.get("val_loss_by_ctx", {}) if isinstance(data, dict) else None
    if not isinstance(by_ctx, dict):
        raise RunError(f"corrupt {Path(path).name} in {Path(path).parent}: val_loss_by_ctx is not a table")
    out = {}
    for n, loss in by_ctx.items():
        if not n.isdigit() or (loss is not None and not _is_float(loss)):
            raise RunError(f"corrupt {Path(path).name} in {Path(path).parent}: val_loss_by_ctx[{n!r}] = "
                           f"{json.dumps(loss)[:40]}; expected a context length and a number or null")
        out[int(n)] = loss
    return out


def read_design(sweep_dir: Path) -> dict | None:
    """sweep.json of a sweep directory ({"components": [record, ...]}), or None when there is none."""
    path = Path(sweep_dir) / SWEEP
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("components"), list):
        raise RunError(f"corrupt {SWEEP} in {Path(sweep_dir)}: no components list")
    return data


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
    """All run directories under root (root itself may be one), sorted by path."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    return sorted(p.parent for p in root.rglob(CONFIG) if "report" not in p.parent.relative_to(root).parts)


SLUG_RE = re.compile(r"[^A-Za-z0-9_.+=-]+")


def slugify(text: str) -> str:
    """A path-safe piece of a run id: no separators, no '..', never empty."""
    slug = SLUG_RE.sub("-", text).strip("-.") or "run"
    return slug[:80]


# Fields added after runs already existed, with the default that reproduces the earlier model: at
# that default they stay out of the hash, so a finished run keeps its id and a rerun skips it.
HASH_NEUTRAL: dict[str, dict[str, Any]] = {
    "model": {"qk_norm": False, "tie_embeddings": False, "parallel_block": False, "logit_softcap": 0.0,
              "gdn_pattern": "", "gdn_heads": None, "gdn_key_heads": None, "gdn_head_dim": None, "gdn_conv": 4,
              "attn_type": "softmax", "q_lora_rank": None, "kv_lora_rank": None, "qk_rope_head_dim": None,
              "qk_nope_head_dim": None, "v_head_dim": None},
    "train": {"z_loss": 0.0},
}


def config_hash(config: dict) -> str:
    config = {k: {f: v for f, v in section.items() if f not in HASH_NEUTRAL.get(k, {}) or v != HASH_NEUTRAL[k][f]}
              if isinstance(section, dict) else section for k, section in config.items()}
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


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
