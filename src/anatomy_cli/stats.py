"""Paired-difference statistics for component effects (no scipy, no torch).

  t_interval   mean and 95% Student-t interval of paired differences, with a two-sided p-value
  t_p_value    two-sided p of a one-sample t statistic (exact for integer degrees of freedom)
  holm         Holm-Bonferroni adjusted p-values for m tests at once (Holm 1979)

Why Holm: a report tests every component in both directions at once (10 tests for the five
2017 -> LLaMA parts). At 95% each, one of ten crossing zero by chance is no surprise; Holm's
step-down keeps the chance of *any* false finding at 5% and is never less powerful than plain
Bonferroni (the correction recent architecture comparisons use: Narang et al. 2021 and after).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05
# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30; beyond 30 the normal 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_975(df: int) -> float:
    return T_975[df - 1] if 1 <= df <= len(T_975) else 1.96


def t_p_value(t: float, df: int) -> float:
    """Two-sided p = P(|T| >= |t|) for Student's t with integer df >= 1.

    The closed form for integer df (Abramowitz & Stegun 26.7.3/26.7.4): with theta = atan(|t|/sqrt(df)),
    A(t|df) = P(|T| < |t|) is a finite series in cos^2(theta), so no special functions are needed.
    """
    if not math.isfinite(t):
        return 0.0 if not math.isnan(t) else math.nan
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:  # odd: 2/pi * (theta + sin cos (1 + 2/3 c2 + 2.4/3.5 c2^2 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2.0 / math.pi * (theta + s * math.cos(theta) * total)
    else:  # even: sin (1 + 1/2 c2 + 1.3/2.4 c2^2 + ...)
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return min(1.0, max(0.0, 1.0 - a))


def t_interval(deltas) -> dict:
    """Mean, 95% Student-t CI and two-sided p of paired differences; within_noise and a note.

    within_noise (uncorrected) is True when the CI contains 0, None with fewer than two pairs.
    """
    deltas = np.asarray(deltas, dtype=float)
    n = len(deltas)
    out = {"mean_delta": float(np.mean(deltas)) if n else math.nan, "ci_low": math.nan,
           "ci_high": math.nan, "p_value": math.nan, "within_noise": None, "note": ""}
    if n == 0:
        out["note"] = "no completed pairs"
    elif n == 1:
        out["note"] = "CI unavailable with one seed"
    else:
        se = float(np.std(deltas, ddof=1)) / math.sqrt(n)
        half = t_975(n - 1) * se
        out |= {"ci_low": out["mean_delta"] - half, "ci_high": out["mean_delta"] + half}
        out["p_value"] = t_p_value(out["mean_delta"] / se, n - 1) if se > 0 else (
            1.0 if out["mean_delta"] == 0 else 0.0)
        out["within_noise"] = bool(out["ci_low"] <= 0.0 <= out["ci_high"])
    return out


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
