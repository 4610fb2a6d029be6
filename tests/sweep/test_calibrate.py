"""Issue #30, class 3: a bad or unwritable calibration cache is measured again, never a crash or a NaN estimate."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from helpers import fake_calibration

from anatomy_cli.sweep import calibrate

GOOD = {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0, "when": "2024-01-01 00:00:00", "busy": False}
NEW = {"step_s": 0.02, "eval_s": 0.2, "run_s": 3.0, "startup_s": 4.0, "when": "2024-02-02 00:00:00"}


class _Cfg:  # the part of a RunConfig that run_seconds reads
    class train:
        steps, eval_interval = 100, 10


@pytest.fixture
def measured(tmp_path, monkeypatch):
    return fake_calibration(tmp_path, monkeypatch, NEW)


def _write(entries) -> Path:
    path = calibrate.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(entries, bytes):
        path.write_bytes(entries)
    else:
        path.write_text(entries if isinstance(entries, str) else json.dumps(entries))
    return path


def _finite(cal: dict) -> None:
    for k in ("step_s", "eval_s", "run_s", "startup_s"):
        assert isinstance(cal[k], float) and math.isfinite(cal[k]) and cal[k] >= 0, (k, cal[k])
    assert math.isfinite(calibrate.run_seconds(_Cfg, cal)) and calibrate.run_seconds(_Cfg, cal) >= 0


BAD_ENTRIES = {
    "entry is a list": [1, 2, 3],
    "entry is a string": "fast",
    "string step time": GOOD | {"step_s": "0.01"},
    "missing key": {k: v for k, v in GOOD.items() if k != "eval_s"},
    "NaN step time": GOOD | {"step_s": float("nan")},
    "inf eval time": GOOD | {"eval_s": float("inf")},
    "negative run time": GOOD | {"run_s": -1.0},
    "negative startup": GOOD | {"startup_s": -1.0},
    "busy is a string": GOOD | {"busy": "no"},
}


@pytest.mark.parametrize("bad", BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_a_bad_entry_is_measured_again_and_rewritten(measured, bad):
    path = _write({"k": bad, "other": GOOD})
    cals = calibrate.calibrations({"k": None, "other": None}, 1)
    assert measured == [1]  # the bad one only; the good one is kept
    _finite(cals["k"])
    assert cals["k"]["step_s"] == NEW["step_s"] and cals["other"]["step_s"] == GOOD["step_s"]
    assert json.loads(path.read_text())["k"]["step_s"] == NEW["step_s"]  # rewritten
    calibrate.calibrations({"k": None, "other": None}, 1)
    assert measured == [1]  # and read back next time


BAD_FILES = {
    "file is a list": "[1, 2]",
    "file is a number": "3",
    "truncated JSON": '{"k": {"step_s": 0.0',
    "empty file": "",
    "not UTF-8": b"\xff\xfe{",
}


@pytest.mark.parametrize("text", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_file_is_treated_as_absent(measured, text):
    path = _write(text)
    _finite(calibrate.calibrations({"k": None}, 1)["k"])
    assert measured == [1]
    assert json.loads(path.read_text())["k"]["step_s"] == NEW["step_s"]
    assert calibrate.cached_overheads() == (NEW["run_s"], NEW["startup_s"])


def test_a_directory_where_the_file_is(measured):
    calibrate.cache_path().mkdir(parents=True)
    _finite(calibrate.calibrations({"k": None}, 1)["k"])
    assert measured == [1]
    assert calibrate.cached_overheads() == (0.0, 0.0)


@pytest.mark.parametrize("bad", [*BAD_ENTRIES.values(), "[1]", "{"], ids=[*BAD_ENTRIES.keys(), "list", "truncated"])
def test_cached_overheads_ignore_a_bad_cache(measured, bad):
    _write(bad if isinstance(bad, str) and bad in ("[1]", "{") else {"k": bad})
    run_s, startup_s = calibrate.cached_overheads()
    assert (run_s, startup_s) == (0.0, 0.0)
    _write({"k": bad, "g": GOOD} if not (isinstance(bad, str) and bad in ("[1]", "{")) else {"g": GOOD})
    assert calibrate.cached_overheads() == (GOOD["run_s"], GOOD["startup_s"])


def test_cache_pointing_at_a_file_still_estimates(measured, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "afile"))
    _finite(calibrate.calibrations({"k": None}, 1)["k"])
    assert measured == [1] and (tmp_path / "afile").read_text() == "x"
    assert calibrate.cached_overheads() == (0.0, 0.0)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod 0o500")
def test_a_read_only_cache_folder_still_estimates(measured):
    folder = calibrate.cache_path().parent
    folder.mkdir(parents=True)
    folder.chmod(0o500)
    try:
        _finite(calibrate.calibrations({"k": None}, 1)["k"])
    finally:
        folder.chmod(0o700)
    assert measured == [1] and not calibrate.cache_path().exists()


def test_an_unwritable_cache_still_estimates(measured, monkeypatch):
    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", refuse)
    _finite(calibrate.calibrations({"k": None}, 1)["k"])
    assert measured == [1] and not calibrate.cache_path().exists()
    assert not list(calibrate.cache_path().parent.glob("*.tmp"))
