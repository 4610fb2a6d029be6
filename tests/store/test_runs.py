"""runs.py, the on-disk schema: atomic writes keep normal permissions; reading a run back validates it."""

from __future__ import annotations

import os
import stat

import pytest

from anatomy_cli.store import runs
from anatomy_cli.store.summary import RunSummary


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_umask_is_read_without_changing_it(umask_027):
    assert runs.umask() == 0o027
    assert os.umask(0o027) == 0o027  # still set


def test_atomic_writes_respect_the_umask(tmp_path, umask_027):
    runs.atomic_write_text(tmp_path / "report.html", "<html></html>")
    runs.atomic_write_json(tmp_path / "summary.json", {"status": "completed"})
    (tmp_path / "plain.txt").write_text("x")  # what any other file written by the user gets
    assert mode(tmp_path / "report.html") == mode(tmp_path / "summary.json") == mode(tmp_path / "plain.txt") == 0o640
    os.umask(0o022)
    runs.atomic_write_text(tmp_path / "runs.csv", "a,b\n")
    assert mode(tmp_path / "runs.csv") == 0o644


def test_weights_and_returned_runs_respect_the_umask(tmp_path, umask_027):
    torch = pytest.importorskip("torch")
    from anatomy_cli.sweep.dask_exec import write_returned
    from anatomy_cli.training.checkpoint import save_checkpoint, save_weights

    save_weights(torch.nn.Linear(2, 2), tmp_path / runs.BEST)
    save_checkpoint({"x": torch.zeros(1)}, tmp_path / runs.RESUME)
    assert mode(tmp_path / runs.BEST) == mode(tmp_path / runs.RESUME) == 0o640
    write_returned(tmp_path / "run", {"data": {"source": None}}, {runs.SAMPLES: b"hi\n"})
    assert mode(tmp_path / "run") == 0o750 and mode(tmp_path / "run" / runs.SAMPLES) == 0o640


# ------------------------------------------------------------------------------ summary.json's schema

OLD = [  # summaries earlier versions wrote: while running, failed, interrupted, completed (with 'flips')
    {"status": "running", "owner": {"pid": 1, "start": None, "host": "h"}, "run_id": "a-s1-12345678"},
    {"status": "failed", "run_id": "a", "error": "RuntimeError: CUDA out of memory", "sweep": "s", "role": "add-one",
     "flip": "rope"},
    {"status": "interrupted", "run_id": "a", "corpus_sha256": "ab" * 32, "error": "KeyboardInterrupt"},
    {"status": "completed", "run_id": "a", "label": "2017", "flips": [], "seed": 1, "params": 10,
     "best_val_loss": 2.5, "best_step": 8, "final_val_loss": 2.6, "bits_per_char": 3.6, "steps_done": 8,
     "tokens_seen": 512, "tokens_per_s": 1e4, "step_time_ms": 3.0, "wall_s": 0.1, "peak_mem_bytes": 1 << 20,
     "device": "cpu", "hardware": "AMD EPYC (2 threads)", "threads": 2, "torch_version": "2.3.0",
     "dtype": "float32", "compiled": False, "diverged_at": None, "error": None},
    {"status": "diverged", "best_val_loss": float("nan"), "diverged_at": 7, "error": "diverged at step 7"},
]


@pytest.mark.parametrize("summary", OLD, ids=[s["status"] for s in OLD])
def test_every_summary_older_versions_wrote_reads_back_as_written(tmp_path, summary):
    runs.atomic_write_json(tmp_path / runs.SUMMARY, summary)
    got = runs.read_summary(tmp_path)
    assert got.keys() == summary.keys() and RunSummary.check(summary) is None


def test_a_summary_from_a_newer_version_keeps_its_new_fields(tmp_path):
    newer = {"status": "completed", "best_val_loss": 2.0, "experts_active": 2, "router": {"kind": "top-k"}}
    runs.atomic_write_json(tmp_path / runs.SUMMARY, newer)
    assert runs.read_summary(tmp_path) == newer
    assert RunSummary.model_validate(newer).record() == newer


@pytest.mark.parametrize("field, value, says", [
    ("best_val_loss", "abc", 'best_val_loss is "abc", not a number'),
    ("best_val_loss", -9.8, "best_val_loss is -9.8, not a loss (a cross-entropy is never negative)"),
    ("params", 3.5, "params is 3.5, not an integer"),
    ("steps_done", True, "steps_done is true, not an integer"),
    ("tokens_per_s", False, "tokens_per_s is false, not a number"),
    ("status", 7, "status is 7, not a string"),
    ("cpu_capability", 512, "cpu_capability is 512, not a string"),
    ("compiled", "yes", 'compiled is "yes", not true or false'),
    ("components", ["rope", 1], "components[1] is 1, not a string"),
    ("owner", "me", 'owner is "me", not an object'),
])
def test_a_summary_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, field, value, says):
    runs.atomic_write_json(tmp_path / runs.SUMMARY, {"status": "completed", field: value})
    with pytest.raises(runs.RunError) as err:
        runs.read_summary(tmp_path)
    assert str(err.value) == f"corrupt {runs.SUMMARY} in {tmp_path}: {says}"


def test_report_columns_are_the_summary_fields_marked_as_columns():
    from anatomy_cli.report import frames
    from anatomy_cli.store.summary import COLUMNS

    assert set(COLUMNS) <= set(frames.RUN_COLUMNS)
    assert {RunSummary.kind(c) for c in COLUMNS} <= {int, float}
    assert {c for c in COLUMNS if RunSummary.kind(c) is int} <= set(frames.INT_COLUMNS)
    assert {c for c in COLUMNS if RunSummary.kind(c) is float} <= set(frames.FLOAT_COLUMNS)


def test_a_job_carries_only_summary_fields():
    from anatomy_cli.sweep.jobs import Job

    Job("r", {}, "d", extra={"sweep": "s", "role": "add-one", "flip": None})
    with pytest.raises(ValueError, match="not RunSummary fields"):
        Job("r", {}, "d", extra={"sweep": "s", "rolle": "add-one"})
    with pytest.raises(ValueError, match="role"):
        Job("r", {}, "d", extra={"role": 3})
