"""The dry run's power lines (issue 38): they count the plan's own effects (`--flip rope,swiglu` on a
folder of five flips has 2 of them, not the folder's 5), each effect on its own variance."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import flat, invoke
from report_runs import called_sweep
from toy_data import write_spec

from anatomy_cli.report import stats
from anatomy_cli.report.verdict import power_lines
from anatomy_cli.sweep import calibrate

FLIPS = ["rmsnorm", "prenorm", "rope", "swiglu", "gqa"]
SDS = [0.01, 0.02, 0.03, 0.05, 0.08, 0.013, 0.021, 0.034, 0.055, 0.089]
NO_RUNS = pd.DataFrame({"role": [], "design": [], "settings": [], "status": [], "wall_s": [], "seed": []})


def _effects(n: int = 3) -> pd.DataFrame:
    """The folder's 10 loss effects (five flips, both directions), judged as the report judges them."""
    rows = [{"metric": "best_val_bpb", "flip": f, "direction": d, "group": "", "n_pairs": n, "gain": 0.05,
             "sd": sd} for (f, d), sd in zip([(f, d) for d in ("add-one", "remove-one") for f in FLIPS], SDS)]
    judged = stats.judge(rows, 0.02)
    return pd.DataFrame(judged)


def _mde(line: str) -> float:
    return float(line.split("an effect of ")[1].split()[0])


def test_the_plan_own_effects_are_counted_and_judged_as_their_family():
    effects = _effects()
    (line,) = power_lines(NO_RUNS, effects, {"rope", "swiglu"})
    assert "the plan's 4 effects' median paired sd" in line and "moderated" not in line, line
    mine = stats.judge(effects[effects["flip"].isin(["rope", "swiglu"])][["metric", "flip", "direction", "group",
                                                                          "n_pairs", "gain", "sd"]].to_dict("records"),
                       0.02)
    assert _mde(line) == pytest.approx(np.median([r["mde"] for r in mine]), abs=6e-4)  # as the plan's verdict would


def test_without_a_plan_every_effect_counts_and_the_mde_is_the_verdict_own():
    effects = _effects()
    (line,) = power_lines(NO_RUNS, effects)
    assert "at 3 seeds the 10 effects' median paired sd" in line, line
    assert _mde(line) == pytest.approx(float(effects["mde"].median()), abs=6e-4)


@pytest.fixture
def fast_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "busy", lambda: None)
    monkeypatch.setattr(calibrate, "_measure", lambda configs, threads: [
        {"step_s": 0.01, "eval_s": 0.1, "run_s": 1.0, "startup_s": 2.0, "when": "2024-01-01 00:00:00"}
        for _ in configs])


def test_a_dry_run_of_two_flips_on_a_folder_of_five_counts_two(tmp_path, fast_calibration):
    called_sweep(tmp_path / "runs" / "toy")  # earlier runs: five flips added to the 2017 end, 3 seeds
    result = invoke("ablate", write_spec(tmp_path), "--flip", "rope,swiglu", "--dry-run", "--runs-dir",
                    tmp_path / "runs")
    assert result.exit_code == 0, result.output
    power = [flat(x) for x in result.stdout.split("power: ")[1:]]
    assert len(power) == 1 and "the plan's 2 effects' median paired sd" in power[0], result.stdout
    assert "moderated" not in power[0] and "5 effects" not in power[0]


def test_a_tuned_family_s_power_counts_the_allowance_no_seed_count_shrinks():
    """Issue 48 item 7: a tuned study's intervals are widened by the LR selection's allowance (allow_low,
    allow_high), which more study seeds do not shrink: no seed count calls twice the margin when the
    allowance is larger, so the dry run must not promise one; a smaller allowance costs seeds and mde."""
    rows = [{"metric": "best_val_bpb", "flip": f, "direction": "add-one", "group": "", "n_pairs": 3, "gain": 0.05,
             "sd": 0.01} for f in FLIPS]
    plain = pd.DataFrame(stats.judge(rows, 0.02))
    (line,) = power_lines(NO_RUNS, plain)
    assert "needs" in line and "--seeds" in line, line
    seeds = int(line.split("--seeds ")[1])
    wide = pd.DataFrame(stats.judge([r | {"allow_low": 0.3, "allow_high": 0.3} for r in rows], 0.02))
    (line,) = power_lines(NO_RUNS, wide)
    assert "--seeds" not in line and "no seed count calls one of 0.040 (twice the margin)" in line, line
    assert "allowance (0.300)" in line and _mde(line) > 0.3
    some = pd.DataFrame(stats.judge([r | {"allow_low": 0.01, "allow_high": 0.01} for r in rows], 0.02))
    (line,) = power_lines(NO_RUNS, some)
    assert int(line.split("--seeds ")[1]) > seeds and _mde(line) > float(plain["mde"].median()), line
