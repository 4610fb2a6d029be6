"""The one rule every call in a report follows, and the paired statistics it rests on (no torch).

The rule. Effects tested together (every loss effect of a study; every speed effect) form one
family of m. Each effect's interval is a simultaneous Bonferroni interval: the Student-t interval at
level 1 - alpha/m over its paired differences (t quantile at 1 - alpha/(2m)), so all m intervals
hold together with probability >= 1 - alpha. A call needs both parts: the statistical one (that
interval excludes zero) and the practical one (the effect is larger than the smallest effect that
matters, `threshold`):
  helps         adjusted interval > 0 and gain > +threshold
  hurts         adjusted interval < 0 and gain < -threshold
  negligible    the adjusted interval lies inside (-threshold, +threshold): confidently too small
  within noise  anything else (undecided)
  too few seeds fewer than MIN_PAIRS paired differences: no call
The interval shown beside a call is the one it is made from; the raw 95% interval and the
Holm-Bonferroni p-value (Holm 1979; step-down, never less powerful than Bonferroni) are details.

  gain       the sign convention: what having the component is worth, positive = it helps
  paired     mean, sd, raw 95% interval and two-sided p of one effect's paired differences
  judge      a family of paired effects -> adjusted intervals, Holm p-values and calls
  holm       Holm-Bonferroni adjusted p-values

Distributions come from scipy.stats (t quantiles at any level, the one-sample t-test).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
MIN_PAIRS = 3
HELPS, HURTS, NEGLIGIBLE, NOISE, TOO_FEW, NONE = (
    "helps", "hurts", "negligible", "within noise", "too few seeds", "no completed pairs")
CALLS = (HELPS, HURTS, NEGLIGIBLE, NOISE, TOO_FEW)
FLOOR, GIVEN = "noise floor", "min-effect"  # where a family's threshold came from (threshold_basis)


def paired(diffs) -> dict:
    """n, gain (mean), sd, raw_low/raw_high (95% t interval) and p_value (one-sample t-test vs 0)."""
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    out = {"n_pairs": n, "gain": float(d.mean()) if n else math.nan, "sd": math.nan,
           "raw_low": math.nan, "raw_high": math.nan, "p_value": math.nan}
    if n < 2:
        return out
    out["sd"] = float(d.std(ddof=1))
    half = float(sps.t.ppf(1 - ALPHA / 2, n - 1)) * out["sd"] / math.sqrt(n)
    out |= {"raw_low": out["gain"] - half, "raw_high": out["gain"] + half}
    if out["sd"] > 1e-12 * max(1.0, abs(out["gain"])):
        out["p_value"] = float(sps.ttest_1samp(d, 0.0).pvalue)
    else:  # identical differences: certain (p 0) unless they are all zero
        out["p_value"] = 1.0 if out["gain"] == 0 else 0.0
    return out


def gain(end, variant, add_one: bool, relative: bool = False, higher_is_better: bool = False):
    """What having a component is worth, from its end's value and its variant's (numbers or arrays).

    add-one: the variant has the component and the end lacks it; remove-one the other way round.
    Lower is better (a loss): without - with, or 100 * (without / with - 1) % when relative; higher
    is better (tokens/s): 100 * (with / without - 1) %. Positive: the component helps.
    """
    with_, without = (variant, end) if add_one else (end, variant)
    if higher_is_better:
        with_, without = without, with_
    if relative:
        with np.errstate(divide="ignore", invalid="ignore"):
            return 100.0 * (np.divide(without, with_) - 1.0)
    return without - with_


def judge(effects: list[dict], threshold: float, alpha: float = ALPHA, min_pairs: int = MIN_PAIRS) -> list[dict]:
    """One family: each dict of `paired` gets adj_low/adj_high, adj_level, family, p_holm, threshold, call.

    The family size m counts the effects that have an interval (two pairs or more); an unknown
    (NaN) threshold counts as 0, so only the statistical part decides.
    """
    rows = [dict(e) for e in effects]
    m = sum(r["n_pairs"] >= 2 for r in rows)
    level = 1 - alpha / max(1, m)
    p_holm = holm([r["p_value"] for r in rows])
    th = threshold if math.isfinite(threshold) else 0.0
    for r, ph in zip(rows, p_holm):
        r |= {"adj_low": math.nan, "adj_high": math.nan, "adj_level": level, "family": m,
              "p_holm": float(ph), "threshold": threshold}
        if r["n_pairs"] >= 2:
            half = float(sps.t.ppf(1 - alpha / (2 * m), r["n_pairs"] - 1)) * r["sd"] / math.sqrt(r["n_pairs"])
            r |= {"adj_low": r["gain"] - half, "adj_high": r["gain"] + half}
        r["call"] = call(r["n_pairs"], r["gain"], r["adj_low"], r["adj_high"], th, min_pairs)
    return rows


def call(n: int, gain: float, low: float, high: float, threshold: float, min_pairs: int = MIN_PAIRS) -> str:
    """The call of one effect from its adjusted interval [low, high] and the threshold (>= 0)."""
    if n == 0 or not math.isfinite(gain):
        return NONE
    if n < min_pairs:
        return TOO_FEW
    if low > 0 and gain > threshold:
        return HELPS
    if high < 0 and gain < -threshold:
        return HURTS
    if -threshold < low and high < threshold:
        return NEGLIGIBLE
    return NOISE


def holm(p_values) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values, in the input order; NaN (untestable) stays NaN.

    Sort the m finite p-values ascending, p_(1) <= ... <= p_(m); the adjusted value of the i-th is
    max over j <= i of min(1, (m - j + 1) p_(j)). A test is a finding at level alpha when its
    adjusted p < alpha, which is exactly Holm's step-down procedure.
    """
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out
