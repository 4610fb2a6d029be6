"""The one rule every call in a report follows, and the paired statistics it rests on (no torch).

The question. Effects tested together answer one question and form one family of m: the loss
effects of one group (one size's design), the speed effects of one group, the trends of one size
ladder. Each family is judged alone, so adding a size to a study never changes another size's calls.

The margin. The smallest effect that matters is fixed before the data: the study spec's `margin` (set when
the study starts), else DEFAULT_MARGIN (bits per byte; SPEED_MARGIN % for speed). The seed-to-seed noise is
reported beside it, never used as it: a margin estimated from the same few seeds makes "negligible"
a claim the data chose (at the true margin it was called negligible 3-15 % of the time).

The interval. Each effect's paired differences (n seeds) give a variance on n - 1 degrees of freedom,
and each effect is judged on its own variance alone: a paired t on n - 1 df, its interval a
simultaneous Bonferroni interval (level 1 - alpha/m, the t quantile at 1 - alpha/(2m)), so all m hold
together with probability >= 1 - alpha whatever the effects' variances are and however they correlate.
No variance borrows from another's (issue 35). Borrowing (the empirical-Bayes moderated t of Smyth
2004, limma's squeezeVar, shipped behind Bartlett's test from issue 28 to 35) shrinks each variance
toward a prior fitted to the family, on d0 prior degrees of freedom. An effect far noisier than the
rest, which the fit does not see, then has its interval narrowed by sqrt(d / (d + d0)) on d + d0 df:
at 3 seeds and m = 10 its false-call probability goes from its 0.5 % share to 1.35 / 2.6 / 5.8 / 13 / 25 %
at d0 = 0.5 / 1 / 2 / 4 / 8 (to 1.15 % at 10 seeds and d0 = 2), and ten 2-df variances cannot show
which effect that is (Bartlett's test passes a 4x outlier 43 % of the time): one such family called
false effects 15 % of the time. So no prior df > 0 keeps the family-wise error at alpha under every
variance; the price is power at few seeds (at 3 seeds and m = 10 the call's 80 % effect is 10.4 paired
sds on 2 df, 2.3 pooled), paid by seeds: `--decide` adds them where an effect is open (3.2 sds at 5
seeds, 1.5 at 10). benchmarks/calibrate_verdict.py measures the rule over a grid of noise settings
(one effect 1.5-10x noisier, spreads to 70x, two noisy effects, heavy tails, collapses; 3-10 seeds,
fixed seeds, --decide and trends): family-wise error, power, coverage and the negligible boundary.

Skewed seed noise (issue 48). A loss that sometimes stays high (a run that escapes a plateau late) makes the
paired differences skewed, and a t on 2-9 df then fails through its small sds: three seeds bunched on the
distribution's steep side give a tiny sd and a t past any Bonferroni quantile (a centred exponential called a
false effect in 15-23 % of ten-effect families at 3 and 10 seeds; gamma k = 4 and lognormal sd 0.25 / 0.5, 1-12 %).
A few seeds cannot show their own skew, so the sd of each effect past the margin is floored at its family's
median sd (sd_floor): an interval only ever widens by it, never narrows, so every bound of the own-variance
rule holds, and the skew grid of benchmarks/calibrate_verdict.py --skew holds 5 % (0-4 %). Its price: the 80 %
power point moves by 2-4 % (10.6 -> 10.8 paired sds at 3 seeds, 1.63 -> 1.69 at 10), and effects well below it
at 3 seeds are called far less often (4 sds: 14 -> 1.3 %).

The call needs the statistical part (the interval) and the practical one (the margin):
  helps          interval > 0 and gain > +margin
  hurts          interval < 0 and gain < -margin
  negligible     the interval lies inside (-margin, +margin): confidently smaller than what matters
  below margin   the interval excludes 0, the gain is inside the margin, but not confidently so
  undecided      the interval holds 0 and reaches past the margin: more seeds would tell
  too few seeds  fewer than MIN_PAIRS paired differences: no call
The interval shown beside a call is the one it is made from; the raw 95% interval and the
Holm-Bonferroni p-value (Holm 1979, on each effect's t) are details. `mde` is the effect the family
calls helps 80 % of the time at its seeds and noise (call_mde): the power of the call, margin included
(not of "the interval excludes 0", (t_crit + t_0.8) x se, which a call at the margin meets half the time).

  gain       the sign convention: what having the component is worth, positive = it helps
  paired     mean, sd, raw 95% interval and two-sided p of one effect's paired differences
  judge      a family of paired effects -> simultaneous intervals, Holm p-values, MDE and calls
  seeds_for  the seeds a family needs to call an effect of a given size helps 80 % of the time
  call_power / call_mde   the power of the call (interval and margin), and the effect it reaches 80 % at
  estimated_mde           the mde printed from an estimated se (median-unbiased: median_sd_ratio)
  holm       Holm-Bonferroni adjusted p-values
  rule_text  the rule's numbers in one clause: the only wording of them (terminal, report, README, docs)

Distributions come from scipy.stats and scipy.special (t and chi-square quantiles, the normal cdf).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

from anatomy_cli.spec import config

ALPHA = config.ALPHA  # the family-wise error (spec/config.py: study records check their alpha against it)
POWER = 0.8
MIN_PAIRS = 3
SKEW_FLOOR = 1.0  # each effect's sd is judged at least at this x its family's median sd (sd_floor: skewed noise)
DEFAULT_MARGIN = 0.02  # bits per byte: the smallest loss effect that matters unless the study's margin says
SPEED_MARGIN = 5.0  # percent of tokens/s
HELPS, HURTS, NEGLIGIBLE, SMALL, UNDECIDED, TOO_FEW, NONE = (
    "helps", "hurts", "negligible", "below margin", "undecided", "too few seeds", "no completed pairs")
CALLS = (HELPS, HURTS, NEGLIGIBLE, SMALL, UNDECIDED, TOO_FEW)
# No call, by design: a speed effect from training runs, which shared the CPU (only a timing pass calls speed)
NOT_TIMED = "not timed"
# Where a family's margin came from (margin_basis): the default, or given before the data by the study's spec or
# command line ("min-effect" in files written before the key was called margin); AFTER: a report's --margin
# other than the margin the study recorded, a view of the same runs.
DEFAULT, GIVEN, GIVEN_BEFORE = "default", "given", "min-effect"
AFTER = "chosen after the runs"


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


def judge(effects: list[dict], margin: float, alpha: float = ALPHA, min_pairs: int = MIN_PAIRS) -> list[dict]:
    """One family: each dict of `paired` gets adj_low/adj_high, adj_level, family, df, se, mde, p_value,
    p_holm, margin and call, by the rule above (each effect's own variance, on n - 1 df).

    The family size m counts the effects that have an interval (two pairs or more); an unknown
    (NaN) margin counts as 0, so only the statistical part decides. An effect of a tuned study carries
    allow_low/allow_high (report/lr_allowance.py's allowance: the bound on the gain the LR selection's error may
    add or hide): its interval is widened by them, its mde by allow_low. Each effect's se is its sd, floored at
    the family's median (sd_floor), over sqrt(n); its p-value is the plain t's (its own sd, no allowance).
    """
    rows = [dict(e) for e in effects]
    tested = [r for r in rows if r["n_pairs"] >= 2]
    m = len(tested)
    level = 1 - alpha / max(1, m)
    known = margin if math.isfinite(margin) else 0.0
    floor = sd_floor([r["sd"] for r in tested])
    for r in tested:
        df = r["n_pairs"] - 1.0
        own = r["sd"] / math.sqrt(r["n_pairs"])
        # skew (sd_floor): an effect past the margin, which a call could say helps or hurts, is judged at least at
        # the family's median sd; one inside it (negligible, below margin, undecided) on its own
        floored = r["sd"] > 1e-12 and abs(r["gain"]) > known
        se = (max(r["sd"], floor) if floored else r["sd"]) / math.sqrt(r["n_pairs"])
        crit = float(sps.t.ppf(1 - alpha / (2 * m), df))
        p = 2 * float(sps.t.sf(abs(r["gain"]) / own, df)) if own > 0 else float(r["gain"] == 0)
        below, above = _allowed(r, "allow_low"), _allowed(r, "allow_high")  # a tuned study's selection error
        r |= {"adj_low": r["gain"] - crit * se - below, "adj_high": r["gain"] + crit * se + above, "df": float(df),
              "se": se, "mde": estimated_mde(se, float(df), crit, known, below), "p_value": p}
    p_holm = holm([r["p_value"] if r["n_pairs"] >= 2 else math.nan for r in rows])
    for r, ph in zip(rows, p_holm):
        r.setdefault("adj_low", math.nan)
        r.setdefault("adj_high", math.nan)
        r.setdefault("df", math.nan)
        r.setdefault("mde", math.nan)
        r.setdefault("se", math.nan)
        r |= {"adj_level": level, "family": m, "p_holm": float(ph), "margin": margin}
        r["call"] = call(r["n_pairs"], r["gain"], r["adj_low"], r["adj_high"], known, min_pairs)
    return rows


def sd_floor(sds) -> float:
    """The least sd an effect of the family is judged on: SKEW_FLOOR x the median of its effects' sds (those above
    0). Skewed seed noise (a loss that sometimes escapes a plateau late) breaks the t interval at a few seeds
    through its small sds, not its means: three seeds bunched near the distribution's bounded side give a tiny
    sd and a t far past any Bonferroni quantile, so a family of ten centred-exponential effects had a false
    call 18-28 % of the time at 3-10 seeds. No sd estimated from 3 seeds can show its own skew, so the rule
    widens instead: the sd of an effect whose gain is past the margin (one a call could say helps or hurts)
    is read as at least the family's median. This only ever widens an interval (never narrows one, as a
    pooled variance would), so it keeps every error bound the own-variance rule has. An effect inside the
    margin keeps its own sd (a quiet part stays reachable as negligible), and so does one with identical
    differences (sd 0: a setting that changes nothing the loss sees). A family of one effect is its own
    median: the floor cannot help it (docs/statistics.md says what holds)."""
    positive = [float(x) for x in sds if math.isfinite(x) and x > 1e-12]  # identical differences: no noise
    return SKEW_FLOOR * float(np.median(positive)) if positive else 0.0


def seeds_for(sd: float, m: int, effect: float, alpha: float = ALPHA, most: int = 1000,
              margin: float = 0.0, allow: float = 0.0) -> int | None:
    """The fewest seeds at which a family of m effects with paired sd `sd` calls `effect` helps 80 % of
    the time (call_mde at n - 1 df: the interval past 0 and the gain past `margin`); None past `most`, and
    None when no seed count can: an effect within the margin, or within `allow` (a tuned study's widening
    below, which no seed count shrinks: the gain must pass it as the interval's low end does)."""
    if not (sd > 0 and effect > 0 and m > 0) or effect <= max(margin, allow):
        return None
    for n in range(MIN_PAIRS, most + 1):
        df = n - 1
        if call_mde(sd / math.sqrt(n), df, float(sps.t.ppf(1 - alpha / (2 * m), df)), margin, allow=allow) <= effect:
            return n
    return None


_U = (np.arange(400) + 0.5) / 400  # quantile levels of the variance estimate's sampling distribution


def _allowed(row: dict, key: str) -> float:
    value = row.get(key, 0.0)
    return float(value) if value is not None and math.isfinite(value) else 0.0


def call_power(effect: float, se: float, df: float, crit: float, margin: float, allow: float = 0.0) -> float:
    """P(an effect of true size `effect` is called helps): its gain ~ N(effect, se^2) must pass both the
    margin and crit x its estimated standard error, which varies as se x sqrt(chi2_df / df), independent
    of the gain (a normal sample's mean and variance). The power of the call, not of 'the interval
    excludes 0': a gain at the margin is called at most half the time. `allow`: the interval's widening
    below (a tuned study's), which the gain must pass too."""
    if not (se > 0 and math.isfinite(df) and df > 0):
        return math.nan
    se_hat = se * _spread(float(df))
    return float(np.mean(special.ndtr((effect - np.maximum(margin, crit * se_hat + allow)) / se)))


def estimated_mde(se: float, df: float, crit: float, margin: float, allow: float = 0.0) -> float:
    """The mde a report prints from an estimated se: call_mde at se / median_sd_ratio(df)."""
    return call_mde(se / median_sd_ratio(df), df, crit, margin, allow=allow)


def median_sd_ratio(df: float) -> float:
    """median(s) / sigma for a variance estimate on df degrees of freedom: sqrt(median(chi2_df) / df), 0.83
    at 2 df, near 1 past 20. The printed mde divides the estimated se by it, so that the mde printed is
    the call's 80 % effect as often too high as too low (plugged in as it is, the estimated sd is below
    the true one more often than not, and so is the mde)."""
    return float(math.sqrt(sps.chi2.median(df) / df)) if math.isfinite(df) and df > 0 else 1.0


@functools.lru_cache(maxsize=512)
def _spread(df: float) -> np.ndarray:
    """sqrt(chi2_df / df) at the quantile levels _U: how an estimated sd varies around the true one."""
    return np.sqrt(sps.chi2.ppf(_U, df) / df)


def call_mde(se: float, df: float, crit: float, margin: float, power: float = POWER, allow: float = 0.0) -> float:
    """The true effect called helps with probability `power` (call_power): the minimum detectable effect
    of the call, margin included; NaN without a standard error."""
    if not (se > 0 and math.isfinite(df) and df > 0):
        return math.nan
    low = max(margin, 0.0)
    high = low + allow + (crit * math.sqrt(sps.chi2.ppf(0.9999, df) / df) + 10) * se
    return float(optimize.brentq(lambda x: call_power(x, se, df, crit, margin, allow) - power, low, high,
                                 xtol=1e-9 * se))


def call(n: int, gain: float, low: float, high: float, margin: float, min_pairs: int = MIN_PAIRS) -> str:
    """The call of one effect from its adjusted interval [low, high] and the margin (>= 0)."""
    if n == 0 or not math.isfinite(gain):
        return NONE
    if n < min_pairs:
        return TOO_FEW
    if low > 0 and gain > margin:
        return HELPS
    if high < 0 and gain < -margin:
        return HURTS
    if -margin < low and high < margin:
        return NEGLIGIBLE
    if low > 0 or high < 0:
        return SMALL
    return UNDECIDED


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


def rule_text(level: float, m: int, looks=1, groups: int = 1) -> str:
    """The rule's numbers in one clause, the one wording every page uses (the terminal verdict, the
    report, its speed section, the README's and docs' rendered blocks): each interval's level, the
    family it is simultaneous over (the m effects of one group), the planned looks (a --decide study's), and
    the family-wise error they add up to by the union bound. looks: how many, each at the same alpha,
    (1 - level) x m x looks in all; or each look's alpha (decide.json's), where they differ: this look's
    (1 - level) x m of their sum."""
    spent = list(looks) if not isinstance(looks, int) else None
    if spent is not None and len(set(spent)) <= 1:
        looks, spent = len(spent), None
    one = m == 1
    family = (f"the {m} effects" if not one else "the one effect") + (" of a group" if groups > 1 else "")
    whom = ("it" if one else f"all {m}") + (" of a group" if groups > 1 and not one else "")
    holds = "holds" if one else "hold together"
    if spent is not None:
        here, alpha = (1 - level) * m, sum(spent)
        return (f"each interval at {_percent(level)} (Bonferroni: this look's {here:.3g} of the {alpha:.3g} spent "
                f"over {len(spent)} looks, split over {family}), so {whom}, at every look, {holds} with "
                f"{_percent(1 - alpha)} confidence")
    alpha = (1 - level) * m * looks
    over = (f"{looks} looks and " if looks > 1 else "") + family
    every = ", at every look," if looks > 1 else ""
    return (f"each interval at {_percent(level)} (Bonferroni: {alpha:.3g} split over {over}), so {whom}{every} "
            f"{holds} with {_percent(1 - alpha)} confidence")


def _percent(x: float) -> str:
    return f"{100 * x:.4g} %"
