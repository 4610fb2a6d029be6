"""TensorBoard event files for runs, written with tensorboard's own record writer (no torch).

Optional: needs the `tb` extra (`pip install 'anatomy-cli[tb]'`, i.e. the tensorboard package).
Without it training runs exactly as before and `anatomy report --tensorboard` says what to install.

  for_run   a hook that Trainer calls with the metric lines of each flush (None without tensorboard)
  resumed   on a resume from a checkpoint: one new event file, rewritten from the metric lines kept
  backfill  event files for existing runs from their metrics.jsonl (`anatomy report --tensorboard`)

Tags (scalars, x = training step): loss/train, loss/val, grad_norm, lr, tokens_per_s (tokens
between two evaluations / the seconds between them, evaluation included); text: config (the
resolved config.json). `tensorboard --logdir runs/` then shows every run of every sweep, named by
its directory. Events are written synchronously through tensorboard.summary.writer.record_writer
(no background thread, so a crashed run loses nothing it flushed).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from anatomy_cli.store import runs

EXTRA = "pip install 'anatomy-cli[tb]'"
PREFIX = "events.out.tfevents."
BACKFILL = f"{PREFIX}0000000000.anatomy-backfill"
SCALAR_TAGS = {"train_loss": "loss/train", "val_loss": "loss/val", "grad_norm": "grad_norm", "lr": "lr",
               "moe_aux_loss": "loss/moe_aux",  # moe_aux_loss: mixture-of-experts runs only
               "dsa_indexer_loss": "loss/dsa_indexer"}  # dsa runs only


def available() -> bool:
    try:
        import tensorboard.summary.writer.record_writer  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    if not available():
        raise runs.RunError(f"--tensorboard needs the tensorboard package: {EXTRA}")


class EventWriter:
    """One event file: a file_version record, then one Event per (step, summary).

    Records are buffered and appended with the file opened only while writing (at each flush of a
    run's metrics): no file handle stays open across training steps or outlives the writer.
    """

    def __init__(self, path: Path, wall_time: float | None = None):
        from tensorboard.compat.proto import event_pb2

        self.pb = event_pb2
        self.path = Path(path)
        self.path.write_bytes(b"")
        self.pending: list[bytes] = []
        self.write(event_pb2.Event(wall_time=wall_time or time.time(), file_version="brain.Event:2"))
        self.rate = TokenRate()

    def write(self, event) -> None:
        self.pending.append(event.SerializeToString())

    def flush(self) -> None:
        from tensorboard.summary.writer.record_writer import RecordWriter

        if self.pending:
            with runs.writing(self.path), open(self.path, "ab") as f:
                writer = RecordWriter(f)
                for record in self.pending:
                    writer.write(record)
            self.pending = []

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        if values:
            summary = Summary(value=[Summary.Value(tag=t, simple_value=float(v)) for t, v in values.items()])
            self.write(self.pb.Event(wall_time=wall_time or time.time(), step=step, summary=summary))

    def text(self, tag: str, text: str, step: int = 0) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
            plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
        tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self.write(self.pb.Event(wall_time=time.time(), step=step,
                                 summary=Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor)])))

    def rows(self, lines: list[dict], wall_time: float | None = None) -> None:
        """metrics.jsonl lines -> scalar events (NaN/inf losses are written as they are)."""
        for row in lines:
            values = {tag: row[key] for key, tag in SCALAR_TAGS.items() if row.get(key) is not None}
            rate = self.rate(row)
            if rate is not None:
                values["tokens_per_s"] = rate
            self.scalars(int(row["step"]), values, wall_time)
        self.flush()

    def close(self) -> None:
        self.flush()


class TokenRate:
    """tokens/s between consecutive evaluation lines (they carry tokens and elapsed_s)."""

    def __init__(self):
        self.last: tuple[float, float] | None = None

    def __call__(self, row: dict) -> float | None:
        if row.get("elapsed_s") is None or row.get("tokens") is None:
            return None
        now = (float(row["tokens"]), float(row["elapsed_s"]))
        last, self.last = self.last, now
        if last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1])


def config_text(config: dict) -> str:
    return "```json\n" + json.dumps(config, indent=2) + "\n```"  # TensorBoard renders text as markdown


def for_run(run_dir: Path, config: dict) -> EventWriter | None:
    """The training hook: a new event file in run_dir (None without tensorboard, or without a run
    directory: a Trainer built for a test or a timing pass writes nothing).

    A fresh run (no metrics.jsonl yet) first drops event files a previous attempt left behind.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not available():
        return None
    if not (run_dir / runs.METRICS).exists():
        for old in run_dir.glob(f"{PREFIX}*"):
            old.unlink(missing_ok=True)
    name = f"{PREFIX}{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    writer = EventWriter(run_dir / name)
    writer.text("config", config_text(config))
    writer.flush()
    return writer


def resumed(run_dir: Path, config: dict, rows: list[dict], elapsed: float) -> EventWriter | None:
    """The hook of a run resumed from a checkpoint: every event file in run_dir replaced by one new
    file holding the config and `rows` (metrics.jsonl up to the checkpoint's step), so TensorBoard,
    which reads every file in the folder, shows each logged step once: points a killed attempt wrote
    past the checkpoint are dropped (they come again), none written before it are lost. Wall times
    are rebuilt from the lines' elapsed_s (`elapsed`: the checkpoint's, now). None without tensorboard.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not available():
        return None
    for old in run_dir.glob(f"{PREFIX}*"):
        old.unlink(missing_ok=True)
    writer = for_run(run_dir, config)
    start, at = time.time() - elapsed, 0.0
    for row in rows:
        at = float(row.get("elapsed_s") or at)
        writer.rows([row], wall_time=start + at)
    writer.flush()
    return writer


def backfill(root: Path) -> dict[str, int]:
    """Event files for every run under root from its metrics.jsonl and config.json.

    Runs whose training wrote events are skipped; an earlier back-filled file is replaced (the run
    may have been resumed since). Returns {"written": n, "skipped": n}.
    """
    require()
    written = skipped = 0
    for run_dir in runs.find_runs(Path(root)):
        own = [p for p in run_dir.glob(f"{PREFIX}*") if p.name != BACKFILL]
        if own:
            skipped += 1
            continue
        base = (run_dir / runs.CONFIG).stat().st_mtime
        tmp = run_dir / f".{BACKFILL}.tmp"
        try:
            writer = EventWriter(tmp, wall_time=base)
            writer.text("config", config_text(runs.read_json(run_dir / runs.CONFIG)))
            for row in runs.read_metrics(run_dir):
                writer.rows([row], wall_time=base + float(row.get("elapsed_s") or 0.0))
            writer.close()
            os.replace(tmp, run_dir / BACKFILL)
        except BaseException:  # interrupted or a full disk: no half-written temp file stays behind
            tmp.unlink(missing_ok=True)
            raise
        written += 1
    return {"written": written, "skipped": skipped}
