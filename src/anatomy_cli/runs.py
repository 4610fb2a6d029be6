"""The on-disk schema of a run (no torch): paths, atomic writes, status, and reading runs back.

A run directory holds, in the order they are written:
  config.json       the resolved RunConfig (vocab_size filled in), written before training
  metrics.jsonl     one JSON object per line: every step has step, train_loss, grad_norm, lr,
                    tokens; evaluation steps add val_loss and elapsed_s
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


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + rename, so readers never see half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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


def read_metrics(run_dir: Path) -> list[dict]:
    """Every complete line of metrics.jsonl (a torn last line from a crash is ignored)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY
    return read_json(path) if path.exists() else None


def run_status(run_dir: Path) -> str | None:
    """The summary's status; 'running' only while its owner lives (a killed run is 'interrupted')."""
    try:
        summary = read_summary(run_dir)
    except RunError:
        return None
    if not isinstance(summary, dict):
        return None
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


def config_hash(config: dict) -> str:
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
