"""`anatomy ablate --decide`: seeds go where the answer is still open (no torch).

A study trains in rounds. After each round its effects are judged; the configs of every effect whose
call is still open (undecided, below margin, too few seeds) get more seeds in the next round, the
rest none. It stops when every effect is decided, the seed cap is reached, or the time budget would
be overrun by another round.

Error control under optional stopping. Looking after every round and stopping on what was seen
would spend the family's alpha once per look. The rounds are planned before any run (the looks at
n0, n0 + step, ..., max_seeds seeds: K looks), and look k's intervals are simultaneous at level
1 - alpha_k over its family, with alpha_1 + ... + alpha_K <= alpha (an alpha-spending plan). By the
union bound, the chance that any interval of any look misses its truth is at most alpha, whatever the
stopping rule and however the looks depend on each other; a call made at any look, the final report
included, keeps the family-wise guarantee. The default spends late (records.late_spending: at looks
3, 5, 7, 9, 10 seeds 0.002, 0.004, 0.006, 0.008, 0.03): an early look with 2 degrees of freedom calls
only large effects whatever its alpha, so alpha spent there buys little, and the final look, where the
open effects end, gets most of it (Pocock's and O'Brien-Fleming's boundaries also spend little early;
this plan needs no assumption about the dependence of the looks). Studies planned before it (and
`decide.spending = "equal"`) split alpha equally, alpha / K at each look; decide.json records each
look's alpha. benchmarks/calibrate_verdict.py --decide measures both. Each look reads the seeds of its
round only (the first n seeds), so a study interrupted and resumed takes the same decisions as one that
ran straight through.

Futility. Seeds also stop for an open effect that the cap could not decide: one whose interval, at
the cap's seed count and the final look's level with its noise as measured now (and a tuned study's
LR-selection allowance, which seeds do not shrink), would still be open for every gain within one
standard error of the one seen (the optimistic end of that range for a difference from zero, the
pessimistic one for "negligible"). Such an effect keeps its call (undecided, below margin) and its
configs get no more seeds for it. Futility only ever withholds seeds, never makes a call, so the
error bound above holds unchanged (a non-binding futility boundary); what it costs is the power of
the effects it gives up on, which benchmarks/calibrate_verdict.py --decide measures.

  schedule       the planned seed counts of the looks
  spending       each look's family-wise alpha (late by default; alpha: the equal split)
  turned_on_by   where its rounds came from: the spec's [decide] table or the command line
  open_effects   the effects whose call is still open
  futile         those no seed count up to the cap would plausibly decide
  open_runs      the run ids of the configs such an effect is paired from
  stop_text      the rounds run and why they stopped, in words
The plan and each round's outcome are RUNS_DIR/decide.json (store/records.py's DecideRecord).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import scipy.stats as sps

from anatomy_cli.report import stats
from anatomy_cli.report.frames import LOSS_METRIC
from anatomy_cli.spec.config import budget_seconds
from anatomy_cli.spec.errors import InputError
from anatomy_cli.spec.roles import END_OF, variant
from anatomy_cli.store import records

# still open: more seeds may decide it (no completed pairs too: never decided, though seeds go to it only
# where its runs can complete, study.rounds)
OPEN = (stats.UNDECIDED, stats.SMALL, stats.TOO_FEW, stats.NONE)
STEP, MAX_SEEDS = 2, 10  # the defaults: two seeds a round, up to ten


def schedule(first: int, max_seeds: int, step: int = STEP, name: str = "decide.max_seeds") -> list[int]:
    """[first, first + step, ..., max_seeds]: the seed counts at which the study looks. name: how the cap was
    given (an option as typed, or the spec's key), for the refusal."""
    if first > max_seeds:
        raise InputError(f"{name}: a cap of {max_seeds} seeds is below the {first} the study starts with (its first "
                         f"look): the cap must be at least the study's seeds")
    looks = list(range(first, max_seeds, step))
    return looks + [max_seeds]


def alpha(looks: list[int]) -> float:
    """The family-wise alpha of each look under equal spending: stats.ALPHA split equally over the looks (the
    plan of every study from before late spending, and of `decide.spending = "equal"`)."""
    return records.equal_alpha(looks)


SPENDINGS = ("late", "equal")


def spending(looks: list[int], plan: str = "late") -> list[float]:
    """Each look's family-wise alpha: "late" (the default: records.late_spending, most of stats.ALPHA at the
    final look) or "equal" (stats.ALPHA / K at each of the K looks)."""
    if plan not in SPENDINGS:
        raise InputError(f"decide.spending: {plan!r} is not one of {', '.join(SPENDINGS)}")
    return records.late_spending(looks) if plan == "late" else [alpha(looks)] * len(looks)


def alphas_text(alphas: list[float]) -> str:
    """'0.025' (every look's) or '0.002, 0.004, 0.006, 0.008, 0.03 (spent late)' for a line."""
    if len(set(alphas)) <= 1:
        return f"{alphas[0]:.4g}" if alphas else ""
    return f"{', '.join(f'{a:.4g}' for a in alphas)} at its looks ({sum(alphas):.4g} in all, spent late)"


def turned_on_by(rules) -> str:
    """Where a --decide study's rounds came from (report.rules' Rules), for the terminal: its spec's [decide]
    table or the command line, as the words after 'turned on by'."""
    record = rules.decide
    spec = rules.invocation.spec if rules.invocation is not None and rules.invocation.spec else None
    if spec is None:
        from anatomy_cli.sweep.plan import DEFAULT_SPEC, experiments_dir

        spec = str(experiments_dir() / DEFAULT_SPEC)
    if record is not None and record.by is not None:
        return "the --decide flag" if record.by == "flag" else f"{spec}'s [decide] table"
    if rules.invocation is None:  # decide.json from before it said, and no record of the spec: either
        return "the --decide flag or its spec's [decide] table"
    import tomllib

    try:  # a study from before decide.json said: its spec's table, if it has one now
        table = "decide" in tomllib.loads(Path(spec).read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return f"the --decide flag or {spec}'s [decide] table"
    return f"{spec}'s [decide] table" if table else "the --decide flag"


def open_effects(effects: pd.DataFrame) -> pd.DataFrame:
    """The loss effects whose call is still open."""
    loss = effects[effects["metric"] == LOSS_METRIC]
    return loss[loss["call"].isin(OPEN)]


def names(effects: pd.DataFrame) -> list[str]:
    """'rope add-one' (with ' (group)' in a multi-group study) for each effect, as decide.json lists them."""
    return [f"{r.flip} {r.direction}" + (f" ({r.group})" if r.group else "") for r in effects.itertuples()]


def futile(effects: pd.DataFrame, cap: int, final_alpha: float | None = None) -> pd.DataFrame:
    """The open effects that `cap` seeds would leave open: at the cap (its n and the degrees of freedom
    that n adds), with each effect's variance as judged now and the final look's level (`final_alpha` over
    the effect's family; None: its level now), its interval widened by its LR-selection allowance (a tuned
    study's, which no seed count shrinks), no gain within one standard error of the one seen gets a decided
    call. An effect without an interval yet (too few seeds) is never futile. Judged at the cap's level, not
    this look's: under late spending an early look's small alpha would otherwise give up on effects the
    final look's larger one decides."""
    still = open_effects(effects)
    keep = []
    for r in still.itertuples():
        n, se, df = r.n_pairs, r.se, r.df
        if not (n >= stats.MIN_PAIRS and cap > n and math.isfinite(se) and se > 0 and math.isfinite(df)):
            keep.append(False)
            continue
        se_cap = se * math.sqrt(n / cap)
        tail = final_alpha / (2 * r.family) if final_alpha is not None else (1 - r.adj_level) / 2
        crit = float(sps.t.ppf(1 - tail, df + cap - n))
        margin = r.margin if math.isfinite(r.margin) else 0.0
        below, above = _allowance(r, "allow_low"), _allowance(r, "allow_high")
        far, near = abs(r.gain) + se, max(0.0, abs(r.gain) - se)  # the gains most and least unlike zero
        # the allowance widens the side toward zero (a helping gain's low end, by the end's regret) and the far side
        lo, hi = (below, above) if r.gain >= 0 else (above, below)
        decided = any(stats.call(cap, g, g - crit * se_cap - lo, g + crit * se_cap + hi, margin) not in OPEN
                      for g in (far, near))
        keep.append(not decided)
    return still[keep] if len(still) else still


def _allowance(row, key: str) -> float:
    value = getattr(row, key, 0.0)
    return float(value) if value is not None and math.isfinite(value) else 0.0


def open_runs(grouped, effects: pd.DataFrame, cap: int | None = None) -> set[str]:
    """Run ids of every config an open effect is paired from: its end's and its variant's runs; with a
    cap, only the open effects that are not futile at it. grouped: (group label, runs) pairs, as
    effects.groups gives them."""
    wanted = open_effects(effects)
    if cap is not None:
        wanted = wanted.drop(futile(effects, cap).index)
    out: set[str] = set()
    for group, members in grouped:
        for r in wanted[wanted["group"] == group].itertuples():
            roles = (END_OF[r.direction], variant(r.flip, r.direction))
            out |= set(members.loc[members["role"].isin(roles), "run_id"])
    return out


def parse_budget(text: str | None, name: str = "decide.budget") -> float | None:
    """'30m' | '2h' | '90s' | '45' (seconds) -> seconds; None for None. name: where the text came from
    (the option as typed, or the spec's key), for the refusal."""
    if text is None:
        return None
    try:
        return budget_seconds(text)
    except ValueError as err:
        raise InputError(f"{name}: {err}") from None


def stop_text(record: records.DecideRecord) -> str:
    """'--decide: 3 rounds (3, 5, 7 seeds); stopped: every effect decided' for the report."""
    seeds = ", ".join(str(r.seeds) for r in record.rounds)
    still = set(record.rounds[-1].open) if record.rounds else set()
    first: dict[str, int] = {}  # each effect still open, at the look that first found it futile
    for r in record.rounds:
        first |= {name: r.seeds for name in r.futile if name in still and name not in first}
    given_up = [f"{name} at {n}" for name, n in first.items()]
    futile_text = f"; seeds withheld as futile (the cap would not decide them): {', '.join(given_up)}" \
        if given_up else ""
    spent = (f"each look at family-wise alpha {record.alphas[0]:.4g} (0.05 split over the looks)" if record.equal
             else f"family-wise alpha {alphas_text(record.alphas)}")
    return (f"--decide: {len(record.rounds)} round{'s' * (len(record.rounds) != 1)} ({seeds} seeds) of the "
            f"{len(record.looks)} planned, {spent}; stopped: {record.stopped or 'still running'}{futile_text}")
