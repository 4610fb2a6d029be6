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

from anatomy_cli.report import decide
from anatomy_cli.report import effects as effects_mod


def looks_of(first: int, max_seeds: int | None, step: int) -> list[int]:
    """The seed counts --decide looks at, from the study's first count (--seeds, else the spec's):
    up to max_seeds, else decide.MAX_SEEDS (or the first count, when it is more)."""
    return decide.schedule(first, max_seeds if max_seeds is not None else max(decide.MAX_SEEDS, first), step)


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

    @property
    def alpha(self) -> float:
        return decide.alpha(self.looks)


@dataclass
class RoundsDone:
    record: decide.DecideRecord
    statuses: dict[str, str | None]  # run id -> status, every run trained or found done
    effects: pd.DataFrame  # the last look's effects


def _plural(n: int) -> str:
    return "s" * (n > 1)


def run_rounds(first: Sequence, rounds: Rounds, train: Callable[[list], list], read: Callable[[], pd.DataFrame],
               plan_at: Callable[[int], list], *, pending: Callable[[list], list] = list,
               cost: Callable[[list], float] = lambda todo: 0.0,
               save: Callable[[decide.DecideRecord], None] = lambda record: None,
               say: Callable[[str], None] = lambda line: None, clock: Callable[[], float] = time.monotonic
               ) -> RoundsDone:
    """Train the first round (`first`: the planned runs at the first look's seeds; each has run_id and
    slug), then at each planned look judge the effects on the look's runs (the runs of its plan at n
    seeds, from `read()`: a runs frame) at the looks' alpha, and give the next round's seeds only to
    the configs of open effects that are not futile.

    train(todo) -> each run's status; plan_at(n) -> the planned runs at n seeds; pending(todo) -> those
    not yet done (a resumed study finds some); cost(todo) -> the estimated seconds of a round when no
    run of this round trained to measure its pace by; save(record) persists decide.json (before each
    look, so a report from then on knows the alpha, and at the end); say(line) tells progress.
    """
    record = decide.DecideRecord(looks=rounds.looks, alpha=rounds.alpha)
    started, statuses, todo, full = clock(), {}, list(first), list(first)  # full: every config at the look's n
    looks, cap = rounds.looks, rounds.looks[-1]
    for k, n in enumerate(looks):
        began, trained = clock(), len(pending(todo))
        statuses |= dict(zip((p.run_id for p in todo), train(todo)))
        save(record)
        ids = {p.run_id: p.slug for p in full}
        runs_k = read()
        runs_k = runs_k[runs_k["run_id"].isin(ids)]
        effects = effects_mod.component_effects(runs_k, min_effect=rounds.margin, alpha=record.alpha)
        still = decide.open_effects(effects)
        hopeless = decide.futile(effects, cap) if rounds.futility else still.iloc[0:0]
        round_s = clock() - began
        record = record.model_copy(update={"rounds": [*record.rounds, {
            "seeds": n, "trained": len(todo), "seconds": round(round_s, 1), "open": decide.names(still),
            "futile": decide.names(hopeless) if k < len(looks) - 1 else []}]})
        if still.empty:
            stopped = "every effect decided"
        elif k == len(looks) - 1:
            stopped = f"the seed cap ({n}) reached with {len(still)} effect{_plural(len(still))} open"
        elif len(hopeless) == len(still):
            stopped = (f"{len(still)} effect{_plural(len(still))} open, none of which {cap} seeds would decide at "
                       f"the noise measured")
        else:
            grouped = effects_mod.groups(runs_k[runs_k["role"] != ""])
            slugs = {ids[r] for r in decide.open_runs(grouped, still.drop(hopeless.index))}
            full = plan_at(looks[k + 1])  # planned once per look: this round's work and the next look's runs
            # every seed up to the next look of each config to seed, that no round gave it yet: a config
            # that sat out a round (its effects were decided then) catches up on the seeds it missed
            todo = [p for p in full if p.slug in slugs and p.run_id not in statuses]
            ahead = pending(todo)
            # the next round's time: at the pace of the runs this round trained, else (every run was found
            # done: a resumed study) the estimate from this machine's calibrated step times
            need = round_s / trained * len(ahead) if trained else cost(ahead)
            if rounds.budget_s is not None and clock() - started + need > rounds.budget_s:
                stopped = f"the budget ({rounds.budget}) would be overrun by the next round"
            else:
                spare = f" ({len(hopeless)} of them futile: no more seeds)" if len(hopeless) else ""
                say(f"--decide: {len(still)} effect{_plural(len(still))} open at {n} seeds{spare}; round {k + 2} "
                    f"trains {len(todo)} runs at {looks[k + 1]} seeds")
                continue
        break
    record = record.model_copy(update={"stopped": stopped})
    save(record)
    say(decide.stop_text(record))
    return RoundsDone(record, statuses, effects)
