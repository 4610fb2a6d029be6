"""The verdict rule's calibration (benchmarks/calibrate_verdict.py, issues 28 and 35) at a test's size.

Synthetic studies with known true effects go through the real pairing and judging code; the numbers
are Monte-Carlo estimates from a fixed seed, so every bound carries three Monte-Carlo sds of slack.
The full grid (one effect 1.5-10x noisier, spreads to 70x, heavy tails, collapses; n = 3, 4, 5, 10) is
the benchmark's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from anatomy_cli.report import effects, stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import calibrate_verdict as cv  # noqa: E402

FAMILIES = 200


def slack(p: float, n: int = FAMILIES) -> float:
    return 3 * math.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def alike_n3():
    """Null, 12 paired sds, the margin's boundary and the printed mde, n = 3, alike noise."""
    scenarios = {"null": 0.0, "power 12": 12 * cv.SIGMA, "edge +1": cv.MARGIN, "edge -1": -cv.MARGIN}
    return cv.run_cell(np.random.default_rng(2035), 3, cv.NOISES["alike"], FAMILIES, scenarios, at_mde=True)


def test_the_rule_holds_its_family_wise_error_and_coverage(alike_n3):
    assert cv.fwer(alike_n3["null"]) <= 0.05 + slack(0.05)
    judged = [j for j in alike_n3.values()]
    # the scenarios share their families (common random numbers): the independent units are the families
    assert np.concatenate([cv.covered(j) for j in judged]).mean() >= 0.95 - slack(0.05)


def test_an_effect_at_the_margin_is_almost_never_called_negligible(alike_n3):
    for edge in ("edge +1", "edge -1"):
        assert cv.rate(alike_n3[edge], stats.NEGLIGIBLE) <= 0.01 + slack(0.01)


def test_the_printed_mde_is_met(alike_n3):
    """A true effect of the mde the report prints (the median over the null's families) is called helps
    about 80 % of the time; each effect alone on 2 df needs about 11 of its paired sds at 3 seeds."""
    at = alike_n3["at the mde"]
    assert 0.8 - slack(0.8) <= cv.rate(at, stats.HELPS) <= 0.8 + slack(0.8)
    assert 9 < at["value"] / cv.SIGMA < 13
    assert cv.rate(alike_n3["power 12"], stats.HELPS) >= 0.8 - slack(0.8)


def test_one_effect_four_times_noisier_keeps_the_family_wise_error():
    """The family a variance test on ten 2-df variances cannot tell from alike (Bartlett passed 43 % of
    them): pooling behind the test called a false effect in 15 % of such families at 3 seeds. Each
    effect on its own variance holds 5 %. Fails with the pooled rule of issues 28-34 put back."""
    families = 400
    cell = cv.run_cell(np.random.default_rng(2036), 3, cv.NOISES["one 4x noisier"], families, {"null": 0.0})
    assert cv.fwer(cell["null"]) <= 0.05 + slack(0.05, families)


def test_heavy_tails_keep_the_family_wise_error():
    families = 300
    cell = cv.run_cell(np.random.default_rng(2037), 3, cv.NOISES["t(3) tails"], families, {"null": 0.0})
    assert cv.fwer(cell["null"]) <= 0.05 + slack(0.05, families)


def test_an_effect_is_judged_on_its_own_variance_whatever_the_others_are():
    """No variance borrows: quieter others never narrow an effect's interval; noisier ones widen it only up to the
    family's median sd (stats.sd_floor, the skew floor), never past it."""
    one = stats.paired([0.30, 0.18, 0.25])
    quiet = [stats.paired(np.array([0.01, -0.01, 0.0]) * (i + 1)) for i in range(9)]
    loud = [stats.paired(np.array([1.0, -1.0, 0.3]) * (i + 1)) for i in range(9)]
    a, b = stats.judge([one, *quiet], 0.02)[0], stats.judge([one, *loud], 0.02)[0]
    for key in ("df", "p_value"):
        assert a[key] == b[key], key
    half = stats.sps.t.ppf(1 - 0.05 / 20, 2) * one["sd"] / math.sqrt(3)
    assert a["adj_high"] == pytest.approx(one["gain"] + half, rel=1e-12) and a["df"] == 2
    median = float(np.median([r["sd"] for r in (one, *loud)]))
    assert b["adj_high"] == pytest.approx(one["gain"] + half * median / one["sd"], rel=1e-12)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_skewed_seed_noise_keeps_the_family_wise_error(n, monkeypatch):
    """Issue 48 item 4: a centred exponential (skewness 2) made the own-variance t call a false effect in
    18-28 % of families at 3-10 seeds, through bunched samples' tiny sds; floored at the family's median sd
    (stats.sd_floor) it holds 5 %. Fails with the floor off (stats.SKEW_FLOOR = 0)."""
    families = 300
    cell = cv.run_cell(np.random.default_rng(2048 + n), n, cv.NOISES["skew exponential"], families, {"null": 0.0})
    assert cv.fwer(cell["null"]) <= 0.05 + slack(0.05, families)


def test_a_noisy_trend_keeps_the_trends_family_wise_error():
    families = 300
    cell = cv.trend_cell(np.random.default_rng(2038), 3, 4.0, families)
    false = np.isin(cell["call"], [cv.scale.GROWS, cv.scale.SHRINKS, cv.scale.REVERSES])
    assert false.any(axis=1).mean() <= 0.05 + slack(0.05, families)
    assert (cell["call"] != "").all()  # every trend of every ladder was judged


@pytest.mark.parametrize("noise", ["alike", "3 % collapses"])
def test_shifting_the_paired_rows_is_what_component_effects_gives_on_runs_with_that_truth(noise):
    """The harness pairs each family once and shifts the tested effect's pairs per scenario; the same
    families simulated with the truth in their losses, through component_effects, call them alike."""
    families, value = 12, 12 * cv.SIGMA
    runs, _ = cv.simulate(np.random.default_rng(7), 3, cv.NOISES[noise], families, truth=cv.tested_only(value))
    direct = effects.component_effects(runs, cv.METRIC).to_dict("records")
    direct = cv._arrays(direct, 0, families)
    runs0, _ = cv.simulate(np.random.default_rng(7), 3, cv.NOISES[noise], families)
    harness = cv.judge(cv.shifted(cv.paired_rows(runs0, 0, families), value), 0)
    assert (direct["call"] == harness["call"]).all()
    np.testing.assert_allclose(direct["low"], harness["low"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(direct["high"], harness["high"], rtol=0, atol=1e-9)


def test_the_grid_sets_the_paired_sds_it_names():
    rng = np.random.default_rng(1)
    sd = cv.NOISES["one 4x noisier"].sds(rng, 3)
    assert sd[:, cv.NOISY[0]].tolist() == [4 * cv.SIGMA] * 3 and (np.delete(sd, cv.NOISY[0], axis=1) == cv.SIGMA).all()
    spread = cv.NOISES["spread 16x"].sds(rng, 500)
    assert (spread[:, cv.TESTED] == cv.SIGMA).all()
    others = np.delete(spread, cv.TESTED, axis=1)
    assert cv.SIGMA / 4 <= others.min() and others.max() <= 4 * cv.SIGMA and others.max() / others.min() > 12


def test_detectable_interpolates_in_log_effect():
    assert cv.detectable({1.0: 0.2, 2.0: 0.6, 4.0: 1.0}) == pytest.approx(2 * 2 ** 0.5)
    assert cv.detectable({1.0: 0.9, 2.0: 1.0}) == 1.0
    assert math.isinf(cv.detectable({1.0: 0.1, 2.0: 0.5}))


def test_one_look_of_decide_is_the_fixed_seed_rule_at_its_seeds():
    """decide_cell with a single planned look judges exactly what run_cell judges at n = 3."""
    fixed = cv.run_cell(np.random.default_rng(7), 3, cv.NOISES["alike"], 30, {"power 12": 12 * cv.SIGMA})
    one = cv.decide_cell(np.random.default_rng(7), [3], cv.NOISES["alike"], 30, 12 * cv.SIGMA)
    assert (one["call"] == fixed["power 12"]["call"]).all()
    assert np.allclose(one["low"], fixed["power 12"]["low"], equal_nan=True)
