"""`--decide`'s rounds, once: train a round, judge its look, seed only the open effects, stop (no torch).

The loop is the same function whether the runs are real (`anatomy ablate --decide`: the trainer
spawns training processes and the reader loads the sweep folder) or simulated
(benchmarks/calibrate_verdict.py --decide: the trainer marks synthetic runs as trained), so the error
rate the harness measures is the error rate of the loop users run. The rule each look applies
(report/decide.py: the looks' alpha, open and futile effects, the runs to seed) is documented there.

  Rounds      the plan of a study's rounds: looks, margin, budget, futility
  RoundsDone  what the rounds did: decide.json's record, every run's status, the last look's effects
  run_rounds  the loop, over any trainer and reader
  looks_of    the seed counts of the looks, from the study's first count and the cap
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from anatomy_cli.report import decide, stats
from anatomy_cli.report import effects as effects_mod
from anatomy_cli.store import records, runs


def looks_of(first: int, max_seeds: int | None, step: int, name: str = "decide.max_seeds") -> list[int]:
    """The seed counts --decide looks at, from the study's first count (its seeds): up to max_seeds, else
    decide.MAX_SEEDS (or the first count, when it is more); name: how the cap was given, for a refusal."""
    return decide.schedule(first, max_seeds if max_seeds is not None else max(decide.MAX_SEEDS, first), step, name)


@dataclass(frozen=True)
class Rounds:
    """A study's rounds, planned before any run: looks at these seed counts, each judged at the looks'
    alpha against `margin` (None: the default); `budget_s` stops before a round that would overrun it
    (`budget`: as typed, for the stop line); futility withholds seeds the cap could not use."""

    looks: list[int]
    margin: float | None = None
    budget_s: float | None = None
    budget: str | None = None
    futility: bool = True
    by: str | None = None  # "flag" (the command line) or "spec" (the spec's [decide] table), in decide.json
    tune: records.TuneRecord | None = None  # a tuned study's record: its looks judge with the LR allowance

    @property
    def alpha(self) -> float:
        return decide.alpha(self.looks)


ESTIMATE_SLACK = 2.0  # a first round estimated past budget / this may overrun it: estimates run short when busy


def budget_note(rounds: Rounds, first_s: float) -> str | None:
    """What a dry run warns of a budget its first round (estimated at first_s seconds) may not fit: over it,
    the study trains nothing; past 1/ESTIMATE_SLACK of it, a round that is never cut short may train past it
    (an estimate runs up to 4x short on a busy machine: benchmarks/RESULTS.md). None: it fits, or no budget."""
    from anatomy_cli.sweep.calibrate import fmt_seconds

    if rounds.budget_s is None:
        return None
    first = f"the budget ({rounds.budget}) and the first round, est. {fmt_seconds(first_s)}"
    if first_s > rounds.budget_s:
        return f"{first}: the round overruns it, so the study would stop before it and train nothing"
    if first_s * ESTIMATE_SLACK > rounds.budget_s:
        return (f"{first}, more than 1/{ESTIMATE_SLACK:g} of it: a round is never cut short and an estimate runs "
                f"short on a busy machine (up to 4x), so the first round may train past the budget")
    return None


@dataclass
class RoundsDone:
    record: records.DecideRecord
    statuses: dict[str, str | None]  # run id -> status, every run trained or found done
    effects: pd.DataFrame  # the last look's effects


def _plural(n: int) -> str:
    return "s" * (n > 1)


def run_rounds(first: Sequence, rounds: Rounds, train: Callable[[list], list], read: Callable[[], pd.DataFrame],
               plan_at: Callable[[int], list], *, pending: Callable[[list], list] = list,
               cost: Callable[[list], float] = lambda todo: 0.0,
               save: Callable[[records.DecideRecord], None] = lambda record: None,
               say: Callable[[str], None] = lambda line: None, clock: Callable[[], float] = time.monotonic,
               before: records.DecideRecord | None = None) -> RoundsDone:
    """Train the first round (`first`: the planned runs at the first look's seeds; each has run_id and
    slug), then at each planned look judge the effects on the look's runs (the runs of its plan at n
    seeds, from `read()`: a runs frame) at the looks' alpha, and give the next round's seeds only to
    the configs of open effects that are not futile and have completed pairs.

    train(todo) -> each run's status; plan_at(n) -> the planned runs at n seeds; pending(todo) -> those
    not yet done (a resumed study finds some); cost(todo) -> the estimated seconds of a round when no
    run of this round trained to measure its pace by; save(record) persists decide.json (the plan before
    the first round trains, so a report from then on knows the alpha; each look; the end); say(line)
    tells progress; before: the record an earlier invocation of this study wrote (a rerun: the budget
    counts the seconds its rounds took). A round whose runs did not all finish (failed, interrupted,
    never started) is not judged: the rounds stop there, and a rerun resumes them.
    """
    record = records.DecideRecord(looks=rounds.looks, alpha=rounds.alpha, margin=rounds.margin, by=rounds.by)
    started, statuses, todo, full = clock(), {}, list(first), list(first)  # full: every config at the look's n
    looks, cap = rounds.looks, rounds.looks[-1]
    earlier = {r.seeds: r.seconds for r in before.rounds} if before is not None else {}
    if before is None:  # a new study's plan, before its first round trains; a record already there stays (it
        save(record)    # may be a running study's, whose rounds this one must not blank before its lock refuses it)
    ahead = pending(todo) if rounds.budget_s is not None else []
    need = cost(ahead) if ahead else 0.0
    if rounds.budget_s is not None and need > rounds.budget_s:
        return _stop(record, f"the budget ({rounds.budget}) would be overrun by the first round (est. "
                              f"{need:.0f} s): nothing trained", statuses, pd.DataFrame(), save, say)
    for k, n in enumerate(looks):
        began, trained = clock(), len(pending(todo))
        got = dict(zip((p.run_id for p in todo), train(todo)))
        statuses |= got
        lost = [s for s in got.values() if s not in runs.DONE_STATES]
        if lost:
            return _stop(record, f"round {k + 1} lost {len(lost)} of {len(todo)} runs ({_tally(lost)}): not judged; "
                                 f"rerun the same command to resume", statuses, pd.DataFrame(), save, say)
        ids = {p.run_id: p.slug for p in full}
        runs_k = read()
        runs_k = runs_k[runs_k["run_id"].isin(ids)]
        effects = effects_mod.component_effects(runs_k, margin=rounds.margin, alpha=record.alpha, tune=rounds.tune)
        still = decide.open_effects(effects)
        hopeless = decide.futile(effects, cap) if rounds.futility else still.iloc[0:0]
        blank = still[still["call"] == stats.NONE]  # every pair lost (diverged): more seeds of it are no answer
        round_s = clock() - began
        if not trained and n in earlier:  # found done: the round took the time it took when it trained
            round_s = max(round_s, earlier[n])
        record = record.model_copy(update={"rounds": [*record.rounds, records.Round(
            seeds=n, trained=len(todo), seconds=round(round_s, 1), open=decide.names(still),
            futile=decide.names(hopeless) if k < len(looks) - 1 else [])]})
        save(record)
        seeded = still.drop(hopeless.index.union(blank.index))
        if still.empty:
            stopped = "every effect decided"
        elif len(blank) == len(still):
            stopped = (f"no completed pairs: {len(blank)} effect{_plural(len(blank))} without a pair of completed "
                       f"runs ({_tally(list(runs_k['status']))} of {len(runs_k)} runs)")
        elif k == len(looks) - 1:
            stopped = f"the seed cap ({n}) reached with {len(still)} effect{_plural(len(still))} open"
        elif seeded.empty:
            stopped = (f"{len(still)} effect{_plural(len(still))} open, none of which {cap} seeds would decide at "
                       f"the noise measured" + (f" ({len(blank)} without completed pairs)" if len(blank) else ""))
        else:
            grouped = effects_mod.groups(runs_k[runs_k["role"] != ""])
            slugs = {ids[r] for r in decide.open_runs(grouped, seeded)}
            full = plan_at(looks[k + 1])  # planned once per look: this round's work and the next look's runs
            # every seed up to the next look of each config to seed, that no round gave it yet: a config
            # that sat out a round (its effects were decided then) catches up on the seeds it missed
            todo = [p for p in full if p.slug in slugs and p.run_id not in statuses]
            ahead = pending(todo)
            # the next round's time: at the pace of the runs this round trained, else (every run was found
            # done: a resumed study) the estimate from this machine's calibrated step times
            need = round_s / trained * len(ahead) if trained else cost(ahead)
            spent = max(clock() - started, sum(r.seconds for r in record.rounds))  # earlier invocations' too
            if rounds.budget_s is not None and spent + need > rounds.budget_s:
                stopped = f"the budget ({rounds.budget}) would be overrun by the next round"
            else:
                say(f"--decide: {len(still)} effect{_plural(len(still))} open at {n} seeds"
                    + (f" ({len(hopeless)} of them futile: no more seeds)" if len(hopeless) else "")
                    + (f" ({len(blank)} without completed pairs: no more seeds)" if len(blank) else "")
                    + f"; round {k + 2} trains {len(todo)} runs at {looks[k + 1]} seeds")
                continue
        break
    return _stop(record, stopped, statuses, effects, save, say)


def _tally(statuses: list) -> str:
    """'2 failed, 1 interrupted, 3 never started' of a list of run statuses (None: never started)."""
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s or "never started"] = counts.get(s or "never started", 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def _stop(record, stopped: str, statuses: dict, effects: pd.DataFrame, save, say) -> RoundsDone:
    record = record.model_copy(update={"stopped": stopped})
    save(record)
    say(decide.stop_text(record))
    return RoundsDone(record, statuses, effects)
