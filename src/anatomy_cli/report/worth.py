"""What a part is worth in compute: the reference end's law on a ladder, each arm's loss inverted to the
compute the reference needs, multipliers with intervals and calls at 1x (no torch).

  fit_law          the law L(C) = L_inf + A C^-alpha on a ladder's rungs (one loss per rung), by variable
                   projection: A and L_inf are linear given alpha, alpha by a profile search
  Law              a fitted law: loss(C), needed(L) (its inverse), the compute range it was fitted on
  compute_worth    a size ladder's runs -> each arm's compute multiplier at every rung (and its wall-clock
                   multiplier where tokens/s were timed), judged one family per rung, and their trends
  data_worth       a budget ladder's runs (one size, several token budgets) -> each arm's data multiplier
  ladder_from_runs the report's runs frame -> the ladder frame both read (LADDER_COLUMNS)
  Worth            the laws, the multipliers and the trends of one ladder, and its record

The question. Marin's gates state a part's worth as compute (marin-community/marin #8227, #9288): fit
the baseline's law on a ladder of sizes, L(C) = L_inf + A C^-alpha, and invert it, C_needed = (A /
(L_variant - L_inf))^(1/alpha); the multiplier is C_needed / C, the compute the reference end would need
to reach the arm's loss over the compute the arm used (C = FLOPs per token, ModelConfig.flops_per_token,
x tokens: an arm cheaper per token, GQA or MoE, has that counted in). A part added to the 2017 end that
helps is worth more than 1x; the LLaMA end losing a part that helps is worth less than 1x.

The law. One law per end, fitted on the end's own rungs (the mean over its seeds at each rung), with one
shape (L_inf, A, alpha) that every arm of that end shares: an arm moves only its multiplier. Free fits per
arm are ill-conditioned on a handful of rungs (Volkova et al. 2026, arXiv 2602.07712); the shared shape
is what Marin's gates and Gundlach et al. 2025 (arXiv 2511.21622) use. L_inf is fitted (>= 0) unless a
floor is given (a known entropy, a larger study's): a given floor that is wrong biases every multiplier,
which benchmarks/calibrate_worth.py measures.

Anchored inversion. An arm's loss is placed on the law at its own rung: level = law(C_r) + (L_arm - L_ref),
the law's value at the reference's compute plus the arm's paired difference (same seed, same data
order), then inverted. On data the law fits exactly this is Marin's inversion of L_variant; where the
law misses a rung by d (noise, or a law of the wrong form) every arm at that rung would otherwise move
by d, and an arm identical to its end would be called worth more or less than 1x. Anchored, the law
lends only its exchange rate between loss and compute near the rung, and an arm that changes nothing
is worth exactly 1x.

The interval: seeds, by the jackknife through the fit. A seed is the unit that replicates: it gives
the reference's loss at every rung (so the law) and each arm's paired difference. Each seed is left out
in turn, the law refitted on the rest and every multiplier recomputed; the pseudo-values n theta -
(n - 1) theta_(-s) are nearly independent across seeds (Tukey 1958), so their spread is the multiplier's
standard error with the law's fit uncertainty in it, and stats.judge takes them as it takes paired
differences: a t on n - 1 df, simultaneous over the family by Bonferroni. Why not a bootstrap: at 3 to 5
seeds a bootstrap has 10 to 126 distinct resamples, and its percentile interval has no t quantile and
shrinks the variance by (n - 1) / n (it undercovers most where studies are). Why not a profile over the
shape: the exchange rate near a rung (the local slope alpha (L - L_inf)) is pinned by the rungs even
where L_inf and alpha trade against each other, and the jackknife follows what the refits do at a
bound, where a profile or a delta method would need the likelihood's shape. Rungs are not resampled: a
3-parameter law on 4 to 8 rungs left one short is barely identified. What the seeds cannot see, a law of
the wrong form, is tested beside it: lack_of_fit compares the rung means' residuals with the seeds'
noise (an F test); p < LACK_OF_FIT_P notes that the law misses its rungs.

The call, at 1x, by stats.judge on log multipliers: a family is the multipliers of one rung (both
directions, every arm), as the loss effects of one size are one family, at the study's alpha. The
margin is a multiplier fixed before the data (WORTH_MARGIN 1.05: within 1/1.05..1.05 is negligible),
judged as log(margin) on the log worth (log m for add-one, -log m for remove-one: positive = the part
helps), so the words are the loss calls' (helps, hurts, negligible, below margin, undecided, too few
seeds). A multiplier whose needed compute lies outside the compute range the law was fitted on (or
below the law's floor, which no compute reaches) rests on the law beyond the ladder: EXTRAPOLATED, its
interval shown, no call. The family counts it all the same (its size is the design's, not the data's).

Wall-clock. Where the runs carry tokens/s from a timing pass, the wall-clock multiplier is the
reference's time to the arm's loss over the arm's time, Sc x (FLOPs/s of the arm) / (FLOPs/s of the
reference) at the rung: Marin's Sc x tps_variant / tps_baseline when FLOPs per token are equal. It
assumes the reference's throughput at the needed compute is its throughput at the rung.

Trends: each arm's log worth per seed (its pseudo-values) across every rung, judged by scale.trends, the
report's trend rule (per-seed slopes on log10 compute, one family per ladder, the margin log(margin)):
grows, shrinks, holds, reverses sign, not called at any size. Extrapolated rungs count (dropping a rung
by its own estimate selects on noise at the range's edge: 4-8 % false trends against 3-5 % with every
rung, benchmarks/calibrate_worth.py --trends) and are named beside the trend (extrapolated_rungs).

Calibrated by benchmarks/calibrate_worth.py through compute_worth and data_worth (benchmarks/RESULTS.md):
with the right law, 0-4.8 % family-wise error per rung at 1x and 95.4-97.3 % coverage over noise at the
shipped studies' levels, 4-8 rungs and 3-10 seeds; a floor given a sixth or a third off, or a strong bend
in log-log, cover 88-93 %. Trends with flat truths: 3.0-5.3 % false trends per ladder (38 % under the
strong bend, whose law lack_of_fit flags).

The data multiplier (data_worth): the same law, fit, inversion, interval and call with tokens in place of
FLOPs, on a budget ladder (one size, several budgets: warmup-stable-decay branches of one run,
training/branch.py): the tokens the reference needs to match the arm over the tokens the arm used.

Refused, one line each (LadderError): fewer than MIN_RUNGS rungs of the reference end, two rungs of one
compute, a reference whose loss does not fall with compute, a margin <= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as sps

from anatomy_cli.report import scale, stats
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.errors import InputError
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, END_OF, REFERENCE, REMOVE_ONE, parse_variant, shown

WORTH_MARGIN = 1.05  # a multiplier within 1/1.05..1.05 is negligible unless the study says otherwise
MIN_RUNGS = 4  # a 3-parameter law needs a residual degree of freedom: fewer rungs are refused
LACK_OF_FIT_P = 0.01  # below it, the law's residuals are beyond the seeds' noise: noted
EXTRAPOLATED = "extrapolated"  # a multiplier that needs the law beyond the ladder: no call
CALLS = (*stats.CALLS, EXTRAPOLATED)
ALPHA_RANGE = (0.01, 4.0)  # the law's exponent is searched in this range (log-spaced grid, then Brent)
_GRID = np.geomspace(*ALPHA_RANGE, 64)
COMPUTE, DATA = "compute", "data"  # a ladder's axis: FLOPs per run (sizes) or tokens per run (budgets)
AXIS_COLUMN = {COMPUTE: "flops", DATA: "tokens"}

LADDER_COLUMNS = ["series", "rung", "direction", "flip", "against", "seed", "loss", "flops", "tokens",
                  "tokens_per_s"]
LAW_COLUMNS = ["series", "direction", "against", "axis", "floor", "scale", "alpha", "unit", "low", "high",
               "rungs", "seeds", "fixed_floor", "lack_of_fit_p", "note"]
WORTH_COLUMNS = ["series", "rung", "direction", "flip", "against", "axis", "cost", "needed", "multiplier",
                 "low", "high", "raw_low", "raw_high", "adj_level", "family", "n_pairs", "worth", "se",
                 "p_value", "p_holm", "margin", "call", "extrapolated", "wall_multiplier", "wall_low",
                 "wall_high", "wall_call", "note"]


class LadderError(InputError):
    """A ladder no law can be fitted on or inverted with: too few rungs, rungs of one compute, a reference
    that does not improve with compute, a margin that is not a multiplier above 1."""


# ------------------------------------------------------------------------------- the law


@dataclass(frozen=True)
class Law:
    """L(C) = floor + scale x (C / unit)^-alpha, fitted on compute in [low, high]."""

    floor: float
    scale: float
    alpha: float
    unit: float  # the rungs' geometric mean compute: the fit's scale, so `scale` is the excess loss there
    low: float
    high: float
    fixed_floor: bool = False
    rss: float = 0.0  # the residual sum of squares of the rung means

    def loss(self, c):
        return self.floor + self.scale * (np.asarray(c, dtype=float) / self.unit) ** -self.alpha

    def needed(self, loss):
        """The compute at which the law reaches `loss` (inf at or below its floor)."""
        excess = np.asarray(loss, dtype=float) - self.floor
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.unit * (self.scale / excess) ** (1.0 / self.alpha)
        return np.where(excess > 0, out, np.inf)

    def inside(self, c, rtol: float = 1e-9) -> np.ndarray:
        """Whether compute c lies in the range the law was fitted on."""
        c = np.asarray(c, dtype=float)
        return (c >= self.low * (1 - rtol)) & (c <= self.high * (1 + rtol))


def _projection(x: np.ndarray, y: np.ndarray, floor: float | None) -> tuple[float, float, float]:
    """(floor, scale, rss) of y ~ floor + scale x, least squares given x = u^-alpha; the floor at 0 when its
    free optimum is negative (a loss floor is not), scale > 0 (a law that falls)."""
    if floor is None:
        xc = x - x.mean()
        sxx = float(xc @ xc)
        a = float(xc @ (y - y.mean())) / sxx if sxx > 0 else 0.0
        e = float(y.mean()) - a * float(x.mean())
        if e >= 0:
            r = y - e - a * x
            return e, a, float(r @ r) if a > 0 else math.inf
        floor = 0.0
    a = float(x @ (y - floor)) / float(x @ x)
    r = y - floor - a * x
    return floor, a, float(r @ r) if a > 0 else math.inf


def fit_law(compute, loss, floor: float | None = None) -> Law:
    """The law through one loss per rung (least squares on the losses): alpha on a log grid over
    ALPHA_RANGE, then Brent's method between the best grid point's neighbours; floor and scale are linear
    given alpha (_projection). `floor`: L_inf given instead of fitted. LadderError when no falling law
    fits (the losses do not fall with compute)."""
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    unit = float(np.exp(np.log(c).mean()))
    lu = np.log(c / unit)

    def rss(log_alpha: float) -> float:
        return _projection(np.exp(-math.exp(log_alpha) * lu), y, floor)[2]

    logs = np.log(_GRID)
    values = np.array([rss(v) for v in logs])
    if not np.isfinite(values).any():
        raise LadderError(f"no law L = L_inf + A C^-alpha that falls with compute fits the losses "
                          f"{', '.join(f'{v:.4g}' for v in y)}")
    i = int(np.nanargmin(values))
    lo, hi = logs[max(i - 1, 0)], logs[min(i + 1, len(logs) - 1)]
    best = optimize.minimize_scalar(rss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    log_alpha = float(best.x) if best.fun <= values[i] else float(logs[i])
    alpha = math.exp(log_alpha)
    e, a, r = _projection(np.exp(-alpha * lu), y, floor)
    return Law(e, a, alpha, unit, float(c.min()), float(c.max()), floor is not None, r)


def lack_of_fit(law: Law, ref: np.ndarray) -> float:
    """P(residuals this large | the law's form is right), from the reference's losses ref (K rungs, n seeds):
    F = (rss / (K - p)) / (s2 / n) on (K - p, (K - 1)(n - 1)) df, p the law's free parameters and s2 the
    rung-by-seed interaction variance (each seed's deviation from the mean curve, less its own offset: a
    seed that is better at every rung moves the floor, not the shape). NaN without the df for it."""
    k, n = ref.shape
    p = 2 if law.fixed_floor else 3
    if k <= p or n < 2:
        return math.nan
    inter = ref - ref.mean(axis=1, keepdims=True) - ref.mean(axis=0, keepdims=True) + ref.mean()
    s2 = float((inter**2).sum()) / ((k - 1) * (n - 1))
    if not s2 > 0:
        return math.nan
    return float(sps.f.sf((law.rss / (k - p)) / (s2 / n), k - p, (k - 1) * (n - 1)))


# ------------------------------------------------------------------------------- the ladder


def check_margin(margin: float) -> float:
    """The margin as given, or a LadderError: a multiplier above 1 (1.05: within 1/1.05..1.05 is negligible)."""
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 1):
        raise LadderError(f"the worth margin is a multiplier above 1 (1.05: within 1/1.05..1.05 is "
                          f"negligible), got {margin!r}")
    return float(margin)


@dataclass(frozen=True)
class _End:
    """One direction's ladder as arrays: the reference end's rungs and seeds, and every arm's pairs."""

    direction: str
    against: str
    rungs: list[str]  # ordered by the reference's cost
    cost: np.ndarray  # (K,) the reference's cost per run at each rung (FLOPs or tokens)
    ref: np.ndarray  # (K, n) the reference's loss, seeds with a completed reference at every rung
    seeds: list[int]
    arms: list[tuple[str, int]]  # (flip, rung index)
    diff: np.ndarray  # (arms, n) arm loss - reference loss, NaN where the seed has no pair
    arm_cost: np.ndarray  # (arms,) the arm's cost per run
    speed: np.ndarray  # (arms, n) log(arm FLOPs/s) - log(reference FLOPs/s), NaN untimed


def _ends(ladder: pd.DataFrame, axis: str) -> list[_End]:
    """The ladder frame's ends (one per direction that has its end's runs), checked: LadderError for fewer
    than MIN_RUNGS rungs, two rungs of one cost, or an end whose mean loss does not fall with cost."""
    out = []
    for direction in (ADD_ONE, REMOVE_ONE):
        rows = ladder[(ladder["direction"] == direction) & np.isfinite(ladder["loss"].astype(float))]
        if not (rows["flip"] == "").any():
            continue
        # (flip, rung) x seed tables of each quantity; the end's flip is ''
        wide = rows.drop_duplicates(["flip", "rung", "seed"]).pivot(
            index=["flip", "rung"], columns="seed", values=["loss", "flops", "tokens", "tokens_per_s"])
        end = wide.loc[""]
        cost = end[AXIS_COLUMN[axis]].median(axis=1).astype(float).sort_values(kind="stable")
        against = str(rows.loc[rows["flip"] == "", "against"].iloc[0]) or f"{END_OF[direction]} end"
        _check_rungs(cost, against, axis)
        ref = end["loss"].loc[cost.index].dropna(axis=1)  # a seed counts when its end completed at every rung
        _check_falls(cost.to_numpy(float), ref.mean(axis=1).to_numpy(float), against, axis)
        out.append(_arms(wide, direction, against, cost, ref, AXIS_COLUMN[axis]))
    return out


def _check_rungs(cost: pd.Series, against: str, axis: str) -> None:
    if len(cost) < MIN_RUNGS:
        raise LadderError(f"a law needs {MIN_RUNGS} rungs or more of the {against}'s {axis}; the ladder has "
                          f"{len(cost)} ({', '.join(map(str, cost.index)) or 'none'})")
    same = cost[cost.duplicated(keep=False)]
    if len(same):
        raise LadderError(f"rungs {' and '.join(map(str, same.index))} of the {against} share one {axis} "
                          f"({same.iloc[0]:.4g}): no law can be fitted between them; make the rungs differ")


def _check_falls(cost: np.ndarray, means: np.ndarray, against: str, axis: str) -> None:
    if len(means) and not np.isfinite(means).all():
        raise LadderError(f"the {against} has no seed completed at every rung: no law to fit")
    slope = np.polyfit(np.log(cost), means, 1)[0]
    if not slope < 0:
        raise LadderError(f"the {against}'s loss does not fall with {axis} over the ladder ({means[0]:.4g} at "
                          f"{cost[0]:.3g} .. {means[-1]:.4g} at {cost[-1]:.3g}): no law to invert")


def _arms(wide: pd.DataFrame, direction: str, against: str, cost: pd.Series, ref: pd.DataFrame,
          col: str) -> _End:
    """_End of one direction from its (flip, rung) x seed tables (_ends), the arms at the end's rungs."""
    seeds = list(ref.columns)
    arms = wide.drop(index="", level="flip")
    arms = arms[arms.index.get_level_values("rung").isin(cost.index)]
    rungs = arms.index.get_level_values("rung")
    base = wide.loc[""].reindex(rungs)  # the end's row at each arm's rung

    def take(frame: pd.DataFrame, what: str) -> np.ndarray:  # (arms, n)
        return frame[what].reindex(columns=seeds).to_numpy(float)

    def flops_s(frame: pd.DataFrame) -> np.ndarray:  # log FLOPs/s: FLOPs per token x tokens/s
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(take(frame, "flops") / take(frame, "tokens") * take(frame, "tokens_per_s"))

    diff = take(arms, "loss") - take(base, "loss")
    speed = flops_s(arms) - flops_s(base)
    speed[~np.isfinite(speed)] = math.nan
    position = {r: i for i, r in enumerate(cost.index)}
    return _End(direction, against, list(cost.index), cost.to_numpy(float), ref.to_numpy(float),
                [int(s) for s in seeds], [(str(f), position[r]) for f, r in arms.index],
                diff, arms[col].median(axis=1).to_numpy(float), speed)


def _thetas(e: _End, keep: np.ndarray, floor: float | None) -> tuple[Law, np.ndarray, np.ndarray]:
    """(law, log multiplier, log needed cost) per arm from the seeds `keep` (bool, n): the law on the
    reference's rung means, each arm's anchored level inverted (module docstring)."""
    law = fit_law(e.cost, e.ref[:, keep].mean(axis=1), floor)
    d = _mean(e.diff, keep)
    rung = np.array([r for _, r in e.arms], dtype=int)
    level = law.loss(e.cost[rung]) + d
    needed = law.needed(level)
    with np.errstate(divide="ignore"):
        return law, np.log(needed) - np.log(e.arm_cost), np.log(needed)


def _jackknife(e: _End, floor: float | None) -> dict:
    """The full fit's law and log multipliers, and per-seed pseudo-values (arms, n) of the log multiplier
    and of the log wall-clock multiplier, NaN where a seed has no pair."""
    n = len(e.seeds)
    full = np.ones(n, dtype=bool)
    law, theta, log_needed = _thetas(e, full, floor)
    speed = _mean(e.speed)
    pseudo = np.full((len(e.arms), n), math.nan)
    wall = np.full((len(e.arms), n), math.nan)
    for s in range(n) if n >= 2 else ():
        keep = full.copy()
        keep[s] = False
        try:
            _, left, _ = _thetas(e, keep, floor)
        except LadderError:  # the seeds left do not fall with compute: this seed's pseudo-values are unknown
            continue
        rest = _mean(e.speed, keep)
        with np.errstate(invalid="ignore"):  # inf - inf below the floor: NaN, no pseudo-value
            pseudo[:, s] = n * theta - (n - 1) * left
            wall[:, s] = n * (theta + speed) - (n - 1) * (left + rest)
    paired = np.isfinite(e.diff)
    pseudo[~paired], wall[~(paired & np.isfinite(e.speed))] = math.nan, math.nan
    return {"law": law, "theta": theta, "log_needed": log_needed, "pseudo": pseudo, "speed": speed,
            "wall": wall}


def _effect(value: float, pseudo: np.ndarray, sign: float) -> dict:
    """stats.paired's shape for one log worth, sign x value (positive = the part helps), for stats.judge: its
    sd the pseudo-values' (so judge's se, sd / sqrt(n), is the jackknife's), its raw 95 % interval around
    the full fit's value. NaN sd where the value or a refit is not finite (below the law's floor)."""
    p = pseudo[np.isfinite(pseudo)]
    n = len(p)
    sd = float(np.std(p, ddof=1)) if n >= 2 else math.nan
    if not (math.isfinite(value) and math.isfinite(sd)):
        sd = math.nan
    gain = sign * value
    half = float(sps.t.ppf(1 - stats.ALPHA / 2, n - 1)) * sd / math.sqrt(n) if n >= 2 else math.nan
    return {"n_pairs": n, "gain": gain, "sd": sd, "raw_low": gain - half, "raw_high": gain + half,
            "p_value": math.nan}


def _mean(a: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Row means over the finite entries (of the columns `keep`), NaN for a row with none, no warning."""
    a = a if keep is None else np.where(keep, a, np.nan)
    ok = np.isfinite(a)
    count = ok.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.where(ok, a, 0.0).sum(axis=1) / count, np.nan)


# ------------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class Worth:
    """One ladder's laws (LAW_COLUMNS), multipliers (WORTH_COLUMNS) and trends (scale.TREND_COLUMNS + the
    fitted multipliers at the smallest and largest rung), on one axis (compute or data) and margin."""

    axis: str
    margin: float
    laws: pd.DataFrame
    multipliers: pd.DataFrame
    trends: pd.DataFrame
    pseudo: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)  # per-seed log worth (the trends')

    def record(self) -> dict:
        """The report JSON's `worth` key (NaN -> null)."""
        from anatomy_cli.report.frames import records

        return {"axis": self.axis, "margin": self.margin, "laws": records(self.laws),
                "multipliers": records(self.multipliers), "trends": records(self.trends)}


def compute_worth(ladder: pd.DataFrame, margin: float = WORTH_MARGIN, alpha: float = stats.ALPHA,
                  floor: float | None = None, *, trends: bool = True) -> Worth:
    """A size ladder (LADDER_COLUMNS, one row per run) -> each arm's compute multiplier at every rung
    (FLOPs the reference end needs / FLOPs the arm used) and, where tokens_per_s is given, its wall-clock
    multiplier; judged one family per rung at `alpha`, against `margin`; trends across rungs (trends=False:
    an empty trends frame, for the calibration harness, which measures the multipliers). floor: L_inf
    given to every end's law instead of fitted."""
    return _worth(ladder, COMPUTE, check_margin(margin), alpha, floor, trends)


def data_worth(ladder: pd.DataFrame, margin: float = WORTH_MARGIN, alpha: float = stats.ALPHA,
               floor: float | None = None, *, trends: bool = True) -> Worth:
    """A budget ladder (one size, rungs = token budgets) -> each arm's data multiplier at every budget
    (tokens the reference end needs to match the arm / tokens the arm used), judged as compute_worth."""
    return _worth(ladder, DATA, check_margin(margin), alpha, floor, trends)


def _worth(ladder: pd.DataFrame, axis: str, margin: float, alpha: float, floor: float | None,
           trends: bool) -> Worth:
    ladder = _complete(ladder)
    laws, rows, pseudo = [], [], []
    for series, part in ladder.groupby("series", sort=False):
        for e in _ends(part, axis):
            jk = _jackknife(e, floor)
            laws.append(_law_row(series, e, jk["law"], axis))
            rows += _rows(series, e, jk, axis)
            pseudo += _pseudo_rows(series, e, jk)
    worth = _ordered(pd.DataFrame(_judge(rows, margin, alpha), columns=WORTH_COLUMNS), rows)
    pseudo_df = pd.DataFrame(pseudo, columns=["series", "rung", "direction", "flip", "seed", "gain", "x"])
    trend = worth_trends(worth, pseudo_df if trends else pseudo_df.iloc[:0], margin, alpha)
    return Worth(axis, margin, pd.DataFrame(laws, columns=LAW_COLUMNS), worth, trend, pseudo_df)


def _ordered(worth: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """Rows by series, direction (add-one first), component (the table's order, then others), rung (cheapest
    first, as each end's ladder runs)."""
    rung = {(r["series"], r["direction"], r["rung"]): i for i, r in enumerate(sorted(rows, key=lambda r: r["ref"]))}
    flips = {f: i for i, f in enumerate(comp.BUILTIN_NAMES)}
    key = pd.DataFrame({"d": worth["direction"] != ADD_ONE, "f": worth["flip"].map(lambda f: flips.get(f, len(flips))),
                        "n": worth["flip"], "r": [rung[k] for k in zip(worth["series"], worth["direction"],
                                                                       worth["rung"])]}, index=worth.index)
    order = key.assign(s=worth["series"]).sort_values(["s", "d", "f", "n", "r"], kind="stable").index
    return worth.loc[order].reset_index(drop=True)


def _complete(ladder: pd.DataFrame) -> pd.DataFrame:
    """The ladder with its optional columns filled (series '', against '', tokens_per_s NaN)."""
    out = ladder.copy()
    for col, default in (("series", ""), ("against", ""), ("tokens_per_s", math.nan), ("tokens", math.nan)):
        if col not in out:
            out[col] = default
    out["flip"] = out["flip"].fillna("").astype(str)
    out["series"] = out["series"].fillna("").astype(str)
    return out


def _law_row(series: str, e: _End, law: Law, axis: str) -> dict:
    p = lack_of_fit(law, e.ref)
    note = (f"the law misses its rungs beyond the seeds' noise (lack of fit p = {p:.2g}): its multipliers rest "
            f"on a law the data doubt" if p < LACK_OF_FIT_P else "")
    return {"series": series, "direction": e.direction, "against": e.against, "axis": axis, "floor": law.floor,
            "scale": law.scale, "alpha": law.alpha, "unit": law.unit, "low": law.low, "high": law.high,
            "rungs": len(e.rungs), "seeds": len(e.seeds), "fixed_floor": law.fixed_floor, "lack_of_fit_p": p,
            "note": note}


def _rows(series: str, e: _End, jk: dict, axis: str) -> list[dict]:
    """One unjudged row per arm and rung: the multiplier's effect (stats.paired's shape) and its wall twin."""
    sign = 1.0 if e.direction == ADD_ONE else -1.0
    law, out = jk["law"], []
    for i, (flip, r) in enumerate(e.arms):
        needed = float(np.exp(jk["log_needed"][i]))
        inside = bool(law.inside(needed))
        note = "" if inside else _outside(needed, law, axis)
        eff = _effect(float(jk["theta"][i]), jk["pseudo"][i], sign)
        timed = np.isfinite(jk["speed"][i])
        wall = _effect(float(jk["theta"][i] + jk["speed"][i]), jk["wall"][i], sign) if timed else None
        out.append({"series": series, "rung": e.rungs[r], "direction": e.direction, "flip": flip,
                    "against": e.against, "axis": axis, "cost": float(e.arm_cost[i]), "needed": needed,
                    "extrapolated": not inside, "note": note, "effect": eff, "wall": wall, "sign": sign,
                    "ref": float(e.cost[r])})
    return out


def _outside(needed: float, law: Law, axis: str) -> str:
    if not math.isfinite(needed):
        return "below the law's floor: no compute reaches it" if axis == COMPUTE else \
            "below the law's floor: no budget reaches it"
    side = f"{needed / law.high:.2f}x the largest rung's" if needed > law.high else \
        f"1/{law.low / needed:.2f} of the smallest rung's"
    return f"needs {side} {axis}: the law beyond the ladder"


def _pseudo_rows(series: str, e: _End, jk: dict) -> list[dict]:
    """Each seed's log worth (its pseudo-value) per arm and rung, every rung with one (the trends' input).
    Extrapolated rungs too: a rule that drops a rung by its estimate (outside the range) selects on noise
    at the range's edge, where a rung enters only when its noise kept it inside, and a flat multiplier
    seems to bend there (benchmarks/calibrate_worth.py --trends: 4-8 % false trends so, 3-5 % with every
    rung)."""
    sign = 1.0 if e.direction == ADD_ONE else -1.0
    return [{"series": series, "rung": e.rungs[r], "direction": e.direction, "flip": flip, "seed": seed,
             "gain": sign * float(jk["pseudo"][i, j]), "x": float(e.cost[r])}
            for i, (flip, r) in enumerate(e.arms) for j, seed in enumerate(e.seeds) if np.isfinite(jk["pseudo"][i, j])]


def _judge(rows: list[dict], margin: float, alpha: float) -> list[dict]:
    """Each rung's multipliers one family (and their wall-clock twins another): stats.judge on log worth
    against log(margin); an extrapolated multiplier keeps its interval, its call is EXTRAPOLATED."""
    out = [dict(r) for r in rows]
    for key in ("effect", "wall"):
        for series, rung in dict.fromkeys((r["series"], r["rung"]) for r in out):
            family = [r for r in out if r["series"] == series and r["rung"] == rung and r[key] is not None]
            for r, judged in zip(family, stats.judge([r[key] for r in family], math.log(margin), alpha)):
                r[key] = judged
    return [_shown(r, margin) for r in out]


def _shown(r: dict, margin: float) -> dict:
    """A judged row in the arm's terms: its multiplier and interval (exp of the log worth, turned back for
    remove-one), the call, the wall-clock twin."""
    eff, sign, wall = r["effect"], r["sign"], r["wall"]
    low, high = sorted((math.exp(sign * eff["adj_low"]), math.exp(sign * eff["adj_high"])))
    raw = sorted((math.exp(sign * eff["raw_low"]), math.exp(sign * eff["raw_high"])))
    call = EXTRAPOLATED if r["extrapolated"] else eff["call"]
    out = {k: r[k] for k in ("series", "rung", "direction", "flip", "against", "axis", "cost", "needed",
                             "extrapolated", "note")}
    out |= {"multiplier": float(np.exp(sign * eff["gain"])),  # inf below the law's floor
            "low": low, "high": high, "raw_low": raw[0], "raw_high": raw[1], "adj_level": eff["adj_level"],
            "family": eff["family"], "n_pairs": eff["n_pairs"], "worth": eff["gain"], "se": eff["se"],
            "p_value": eff["p_value"], "p_holm": eff["p_holm"], "margin": margin, "call": call}
    if wall is None:
        return out | {"wall_multiplier": math.nan, "wall_low": math.nan, "wall_high": math.nan, "wall_call": ""}
    wl, wh = sorted((math.exp(sign * wall["adj_low"]), math.exp(sign * wall["adj_high"])))
    return out | {"wall_multiplier": math.exp(sign * wall["gain"]), "wall_low": wl, "wall_high": wh,
                  "wall_call": EXTRAPOLATED if r["extrapolated"] else wall["call"]}


# ------------------------------------------------------------------------------- trends


def worth_trends(worth: pd.DataFrame, pseudo: pd.DataFrame, margin: float, alpha: float = stats.ALPHA) -> pd.DataFrame:
    """scale.trends on the log worth: per series, arm and direction, the per-seed slopes of the pseudo-values
    on log10 of the rung's cost over every rung (_pseudo_rows), one family per series, called by
    scale.scale_call against log(margin) with the calls at each rung; plus multiplier_smallest/largest (the
    fitted line at the ladder's ends, in the arm's terms) and extrapolated_rungs (the rungs whose
    multiplier needs the law beyond the ladder: the trend leans on the law there)."""
    cols = [*scale.TREND_COLUMNS, "multiplier_smallest", "multiplier_largest", "extrapolated_rungs"]
    if pseudo.empty:
        return pd.DataFrame(columns=cols)
    against = worth.drop_duplicates(["series", "direction"]).set_index(["series", "direction"])["against"]
    gains = pseudo.rename(columns={"rung": "size", "x": "non_embedding_params"}).assign(
        against=[against.get((s, d), "") for s, d in zip(pseudo["series"], pseudo["direction"])])
    at_rungs = worth.rename(columns={"rung": "size"})[["series", "flip", "direction", "call"]]
    out = scale.trends(gains, at_rungs, math.log(margin), None, alpha)
    sign = np.where(out["direction"] == ADD_ONE, 1.0, -1.0)
    out["multiplier_smallest"] = np.exp(sign * out["fit_smallest"].astype(float))
    out["multiplier_largest"] = np.exp(sign * out["fit_largest"].astype(float))
    outside = worth[worth["extrapolated"]].groupby(["series", "direction", "flip"], sort=False)["rung"].agg(
        lambda r: ", ".join(map(str, r)))
    out["extrapolated_rungs"] = [outside.get((s, d, f), "") for s, d, f in
                                 zip(out["series"], out["direction"], out["flip"])]
    return out[cols]


# ------------------------------------------------------------------------------- from the runs frame


def ladder_from_runs(runs: pd.DataFrame, rung: str | pd.Series = "size", metric: str = "best_val_bpb",
                     costs: pd.DataFrame | None = None, speed: pd.Series | None = None) -> pd.DataFrame:
    """The report's runs frame (completed runs with a role) -> LADDER_COLUMNS. rung: the column (or a Series
    on runs' index) naming each run's rung ('size', or the budget of a budget ladder); costs: flops and
    tokens per run (run_costs' columns, on runs' index), read from each run's config.json when None;
    speed: tokens/s per run from a timing pass (absent: no wall-clock multiplier). The two ends are the
    references of their directions; a '+f' run is f added to the reference end, a '-f' run f removed from
    the all-on end."""
    done = runs[(runs["role"] != "") & (runs["status"] == "completed")]
    rung_of = done[rung] if isinstance(rung, str) else rung.loc[done.index]
    costs = run_costs(done) if costs is None else costs
    rows = []
    for i, r in done.iterrows():
        parsed = parse_variant(r["role"])
        direction, flip = parsed if parsed else ({REFERENCE: ADD_ONE, ALL_ON: REMOVE_ONE}[r["role"]], "")
        ends = comp.end_names(str(r.get("design", "")).split("+")) if r.get("design") else ()
        against = f"{shown(ends[0 if direction == ADD_ONE else 1])} end" if ends else ""
        rows.append({"series": "", "rung": rung_of[i], "direction": direction, "flip": flip, "against": against,
                     "seed": int(r["seed"]), "loss": float(r[metric]), "flops": float(costs.loc[i, "flops"]),
                     "tokens": float(costs.loc[i, "tokens"]),
                     "tokens_per_s": float(speed.get(i, math.nan)) if speed is not None else math.nan})
    return pd.DataFrame(rows, columns=LADDER_COLUMNS)


def run_costs(runs: pd.DataFrame) -> pd.DataFrame:
    """flops and tokens per run (runs' index), from each run's config.json: ModelConfig.flops_per_token x
    train.steps x batch_size x ctx_len (the planned tokens: a completed run's)."""
    from anatomy_cli.spec.config import RunConfig, validate
    from anatomy_cli.store.runs import CONFIG, read_json

    rows = {}
    for i, path in runs["path"].items():
        cfg = validate(RunConfig, read_json(Path(path) / CONFIG))
        tokens = cfg.train.steps * cfg.train.batch_size * cfg.model.ctx_len
        rows[i] = {"flops": float(cfg.model.flops_per_token() * tokens), "tokens": float(tokens)}
    return pd.DataFrame.from_dict(rows, orient="index", columns=["flops", "tokens"])


def describe(law: Law | pd.Series | dict) -> str:
    """'L(C) = 1.32 + 0.84 (C / 3.1e+12)^-0.21' for a law or a law row."""
    get = (lambda k: getattr(law, k)) if isinstance(law, Law) else (lambda k: law[k])
    return f"L(C) = {get('floor'):.4g} + {get('scale'):.4g} (C / {get('unit'):.3g})^-{get('alpha'):.3g}"


