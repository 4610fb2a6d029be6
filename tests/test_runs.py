"""runs.py, the on-disk schema: atomic writes keep normal permissions; reading a run back validates it."""

from __future__ import annotations

import os
import stat

import pytest

from anatomy_cli import runs


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
    from anatomy_cli.checkpoint import save_state, save_weights
    from anatomy_cli.dask_exec import write_returned

    save_weights(torch.nn.Linear(2, 2), tmp_path / runs.BEST)
    save_state({"x": torch.zeros(1)}, tmp_path / runs.RESUME)
    assert mode(tmp_path / runs.BEST) == mode(tmp_path / runs.RESUME) == 0o640
    write_returned(tmp_path / "run", {"data": {"source": None}}, {runs.SAMPLES: b"hi\n"})
    assert mode(tmp_path / "run") == 0o750 and mode(tmp_path / "run" / runs.SAMPLES) == 0o640
