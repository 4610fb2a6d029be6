"""In a pipe or a log (issue 38): `anatomy ablate` says what it measures before the plan line, and
LineDisplay prints a line at least every minute while runs train (the interval and clock injected:
no test waits a minute)."""

from __future__ import annotations

import pytest
from helpers import fake_calibration, flat, invoke
from toy_data import write_spec

from anatomy_cli.cli import render
from anatomy_cli.store import runs

CAL = {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0, "when": "2024-01-01 00:00:00"}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_minute_of_training_without_a_finished_run_prints_a_line(capsys):
    clock = Clock()
    display = render.LineDisplay(4, every=60.0, clock=clock, planned_s=600.0)
    with display:
        display({"event": "plan", "total": 4, "todo": 4, "skipped": 0})
        display({"event": "start", "run_id": "a", "steps": 100})
        display({"event": "start", "run_id": "b", "steps": 100})
        clock.now = 30.0
        display({"event": "progress", "run_id": "a", "step": 10, "steps": 100, "val_loss": 3.0})
        assert _lines(capsys) == []  # under a minute: nothing yet
        clock.now = 61.0
        display({"event": "progress", "run_id": "b", "step": 10, "steps": 100, "val_loss": 3.0})
        # 0.2 runs' worth of steps in 61 s, 3.8 left
        assert _lines(capsys) == ["still training: 0 of 4 runs done, 2 in flight; 61s elapsed, est. 19.3min left"]
        clock.now = 90.0
        display({"event": "progress", "run_id": "a", "step": 20, "steps": 100, "val_loss": 2.9})
        assert _lines(capsys) == []  # at most one a minute


def test_a_finished_run_line_resets_the_minute_and_the_estimate_follows_the_pace(capsys):
    clock = Clock()
    display = render.LineDisplay(3, every=60.0, clock=clock)
    display({"event": "plan", "total": 3, "todo": 2, "skipped": 1})
    display({"event": "start", "run_id": "a", "steps": 10})
    clock.now = 50.0
    display({"event": "done", "run_id": "a", "summary": {"status": runs.COMPLETED, "best_val_loss": 2.5, "wall_s": 50}})
    assert _lines(capsys) == ["1 of 3 runs already done", "[2/3] a: best val 2.5000, 50 s"]
    display({"event": "start", "run_id": "b", "steps": 10})
    clock.now = 100.0  # 50 s after the last line: not yet
    display({"event": "progress", "run_id": "b", "step": 5, "steps": 10, "val_loss": 3.0})
    assert _lines(capsys) == []
    clock.now = 111.0  # one run and a half trained here in 111 s: the half left takes 37 s
    display({"event": "progress", "run_id": "b", "step": 5, "steps": 10, "val_loss": 3.0})
    assert _lines(capsys) == ["still training: 2 of 3 runs done, 1 in flight; 1.9min elapsed, est. 37s left"]


def test_without_an_estimate_or_progress_the_line_leaves_the_time_left_out(capsys):
    clock = Clock()
    display = render.LineDisplay(2, every=5.0, clock=clock)
    display({"event": "start", "run_id": "a", "steps": 10})
    clock.now = 6.0
    display({"event": "start", "run_id": "b", "steps": 10})
    assert _lines(capsys) == ["still training: 0 of 2 runs done, 2 in flight; 6s elapsed"]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """No cached calibration; measuring it is instant (a fake) and counted."""
    return fake_calibration(tmp_path, monkeypatch, CAL)


def test_ablate_says_what_it_measures_before_the_plan_line(tmp_path, monkeypatch, fresh_cache):
    from anatomy_cli.cli import sweep

    monkeypatch.setattr(sweep, "_train", lambda study, estimate, todo: [runs.COMPLETED] * len(todo))
    spec = write_spec(tmp_path)
    result = invoke("ablate", spec, "--flip", "rope", "--seeds", "1", "--workers", "1", "--no-report",
                    "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    plan = next(i for i, line in enumerate(lines) if line.startswith("plan: 4 runs -> "))
    said = flat(" ".join(lines[:plan]))  # wrapped to the terminal: the measuring line may take several
    assert said.startswith("measuring this machine's step times for the estimate: a 30-step run of each of 1 model "
                           "shape in a worker (once per shape, cached in "), lines
    assert fresh_cache == [1]
    again = invoke("ablate", spec, "--flip", "rope", "--seeds", "1", "--workers", "1", "--no-report",
                   "--runs-dir", tmp_path / "runs2")
    assert again.stderr.lstrip().startswith("plan: 4 runs -> "), again.stderr  # cached: the plan line first
    assert fresh_cache == [1]


def test_a_dry_run_says_what_it_measures_too(tmp_path, fresh_cache):
    result = invoke("ablate", write_spec(tmp_path), "--flip", "rope", "--seeds", "1", "--dry-run",
                    "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("measuring this machine's step times"), result.stderr
    assert max(map(len, result.output.splitlines())) <= 80  # wrapped to the terminal, as everything else
