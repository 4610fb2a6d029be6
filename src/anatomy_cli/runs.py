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
                    'interrupted', 'running'), losses, params, tokens, speed, hardware
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

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
    try:
        summary = read_summary(run_dir)
    except RunError:
        return None
    return summary.get("status") if summary else None


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
