"""report/lr_allowance.py: the LR selection's own error in a tuned study's intervals: each config's regret bound
(the runner-up's chance plus what the grid's step costs), the allowance an effect's interval is widened by (below
by the config without the component, above by the one with it), its noise floored at the family's median sd."""

from __future__ import annotations

import math

import pytest

from anatomy_cli.report import lr_allowance
from anatomy_cli.report.build import build_report
from anatomy_cli.store import records
from tests.report.test_lr_comparison import OPTIMUM, tuned_folder


def test_the_regret_bound_is_the_runner_up_chance_plus_the_grid_step_cost():
    lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    sharp = [2.4, 2.1, 2.0, 2.1, 2.4]  # symmetric, a lead of 0.1: a runner-up is no threat at sigma 0.01
    assert lr_allowance.regret_bound(lrs, sharp, 4e-3, sigma=0.01) == 0.0
    assert lr_allowance.regret_bound(lrs, sharp, 4e-3, sigma=0.05) == pytest.approx(2 * 0.05 * math.sqrt(2) - 0.1)
    lopsided = [2.5, 2.1, 2.0, 2.3, 2.6]  # the quadratic's vertex a quarter step down, 0.0125 below the point
    assert lr_allowance.regret_bound(lrs, lopsided, 4e-3, sigma=0.0) == pytest.approx(0.0125)
    flat = [2.0] * 5
    assert lr_allowance.regret_bound(lrs, flat, 4e-3, sigma=0.01) == pytest.approx(2 * 0.01 * math.sqrt(2))
    assert math.isnan(lr_allowance.regret_bound(lrs, sharp, None, sigma=0.01))  # not tuned
    assert math.isnan(lr_allowance.regret_bound(lrs, sharp, 1e-3, sigma=0.01))  # an edge is never chosen


def test_the_allowance_widens_below_by_the_config_without_the_component(tmp_path):
    root = tuned_folder(tmp_path)
    record = records.read_tune(root)
    end, var = (lr_allowance.regret_bound(a.lrs, a.losses, a.lr, 0.02 / math.sqrt(2)) for a in record.arms)
    added = lr_allowance.allowance(record, "2017", "2017+rope", True, 0.02)
    removed = lr_allowance.allowance(record, "2017", "2017+rope", False, 0.02)  # the end then has the component
    assert (added["allow_low"], added["allow_high"]) == (end, var)
    assert (removed["allow_low"], removed["allow_high"]) == (var, end)


def test_an_effects_own_sd_is_floored_at_its_familys_median_in_the_allowance(tmp_path):
    """At 3 seeds an effect's sd is often far below its truth, and its interval narrow exactly then: the
    allowance takes the larger of its own sd and the median of the effects judged with it."""
    record = records.read_tune(tuned_folder(tmp_path))
    assert lr_allowance.family_sd([0.03, math.nan, 0.01, None, 0.02]) == 0.02
    assert lr_allowance.family_sd([0.01, 0.04]) == pytest.approx(0.025) and math.isnan(lr_allowance.family_sd([]))
    floored = lr_allowance.allowance(record, "2017", "2017+rope", True, 1e-4, floor=0.02)
    assert floored == lr_allowance.allowance(record, "2017", "2017+rope", True, 0.02)
    assert lr_allowance.allowance(record, "2017", "2017+rope", True, 0.03, floor=0.02) == \
        lr_allowance.allowance(record, "2017", "2017+rope", True, 0.03)
    assert lr_allowance.allowance(record, "2017", "2017+rope", True, math.nan, floor=0.02) == floored


def test_a_tuned_report_widens_each_tuned_interval_and_says_so_and_not_the_shared_ones(tmp_path):
    root = tuned_folder(tmp_path, {k: v * 2 ** 0.3 for k, v in OPTIMUM.items()})  # optima between grid points
    r = build_report(root)
    effects = r.effects
    row = effects[effects["metric"] == "best_val_bpb"].iloc[0]
    bound = lr_allowance.allowance(records.read_tune(root), "2017", "2017+rope", True, row["sd"])
    crit = (row["gain"] - row["adj_low"] - bound["allow_low"]) / row["se"]
    assert crit == pytest.approx((row["adj_high"] - bound["allow_high"] - row["gain"]) / row["se"])
    assert bound["allow_low"] > 0 and "interval widened by the LR selection's error" in row["note"]
    shared = r.tuning.comparison.iloc[0]
    assert shared.shared_high - shared.shared_gain == pytest.approx(shared.shared_gain - shared.shared_low)
