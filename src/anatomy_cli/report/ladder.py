"""A study's ladder in the report (no torch): the rungs its runs stand on, each part's compute (or data)
multiplier at every rung from report/worth.py, or the one line saying why the study has none.

  study_ladder   the report's runs and study records -> Ladder (None: the study has no ladder at all)
  Ladder         the ladder frame (worth.LADDER_COLUMNS), its Worth (None: no usable ladder) and the note
                 that says why not; record() is the report JSON's and the results file's `worth` key

Which ladder. A study with sizes ([[sizes]]) is a compute ladder: each run's rung is its size and its cost
the FLOPs it trained (worth.run_costs). A budget ladder (one size, rungs = token budgets: the runs of a
`[budgets]` study, branches of one stable run) is a data ladder: its rung is the budget, its cost the
tokens. A study with neither has no ladder: nothing is said.

Asked or not. The multipliers are asked for where the study recorded a worth margin (the spec's
`worth_margin`) or the report is asked with `anatomy report --worth-margin M`: there a ladder no law can
be fitted on (fewer than worth.MIN_RUNGS rungs, rungs of one cost, a reference that does not improve) is
refused (worth.LadderError, one line, exit 2). Where the study simply has a ladder (experiments/scale.toml's
three sizes, or a budget ladder whose runs are not all done yet: its spec was refused with fewer than 4
budgets), the report says in one line why it has no multipliers and the rest of it is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from anatomy_cli.report import stats, worth
from anatomy_cli.report.frames import LOSS_METRIC

BUDGET = "budget"  # a budget ladder's rung: '<steps> steps'


@dataclass(frozen=True)
class Ladder:
    """A study's ladder: axis (worth.COMPUTE or worth.DATA), its rungs by cost, the ladder frame, the Worth
    computed on it (None where no law can be fitted) and the one line why not."""

    axis: str
    rungs: tuple[str, ...]
    frame: pd.DataFrame
    worth: worth.Worth | None
    note: str = ""

    def record(self) -> dict:
        """The `worth` key of report.json and the results file: the Worth's record, or the note alone."""
        out = {"axis": self.axis, "rungs": list(self.rungs), "note": self.note}
        return out | (self.worth.record() if self.worth is not None else {})


def rung_column(runs: pd.DataFrame) -> str | None:
    """'size' for a size ladder, BUDGET for a budget ladder, None without a ladder (fewer than two rungs)."""
    studied = runs[runs["role"] != ""]
    for col in (BUDGET, "size"):
        if col in studied and studied[col].replace("", pd.NA).dropna().nunique() >= 2:
            return col
    return None


def budget_rungs(runs: pd.DataFrame, budgets) -> pd.Series:
    """Each run's budget rung ('200 steps': its config's train.steps, one of the study's budgets; '' else)."""
    from anatomy_cli.store.runs import CONFIG, read_json

    budgets = {int(b) for b in budgets}
    steps = [((read_json(Path(p) / CONFIG) or {}).get("train") or {}).get("steps") for p in runs["path"]]
    return pd.Series([f"{s} steps" if s in budgets else "" for s in steps], index=runs.index, dtype=object)


def study_ladder(runs: pd.DataFrame, margin: float | None = None, asked: bool = False,
                 alpha: float = stats.ALPHA, budgets=()) -> Ladder | None:
    """The report's judged runs -> their Ladder, or None where the study has no ladder. margin: the worth
    margin (None: worth.WORTH_MARGIN); asked: the user asked for the multipliers (a worth margin given, a
    budget ladder), so a ladder no law fits raises worth.LadderError instead of becoming the note; budgets:
    the study's budget ladder (sweep.json's budgets: its runs' rungs are their train steps)."""
    if len(budgets) and len(runs):
        runs = runs.assign(**{BUDGET: budget_rungs(runs, budgets)})
    col = rung_column(runs)
    if col is None:
        if asked and margin is not None:
            worth.check_margin(margin)
        return None
    axis = worth.DATA if col == BUDGET else worth.COMPUTE
    done = runs[(runs["role"] != "") & (runs["status"] == "completed") & (runs[col] != "")]
    frame = worth.ladder_from_runs(done, col, LOSS_METRIC)
    rungs = tuple(frame.sort_values(worth.AXIS_COLUMN[axis], kind="stable")["rung"].drop_duplicates())
    how = worth.data_worth if axis == worth.DATA else worth.compute_worth
    try:
        found = how(frame, margin if margin is not None else worth.WORTH_MARGIN, alpha)
    except worth.LadderError as e:
        if asked:
            raise
        return Ladder(axis, rungs, frame, None, f"No {axis} multipliers: {e}.")
    return Ladder(axis, rungs, frame, found)
