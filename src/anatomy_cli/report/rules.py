"""A study's rules, read once from its folder (no torch): what every effect of the report is judged by.

  Rules       one study folder's records (sweep.json, decide.json, tune.json, timing.json: store/records.py),
              each read once, and what they make of the judging: the margin and its basis, the alpha of
              each family, the looks planned, whether it was tuned, how it was asked for
  read_rules  the Rules of a folder (at another margin than the study's: a view, `report --margin M`)
  judged_by   the study folder whose Rules judge the runs under a root (refusing studies of other rules)

The margin. The study recorded its margin when it started (sweep.json; none: stats.DEFAULT_MARGIN). A report
at another margin is a view of the same runs: its effects are judged at it, with the basis saying it was
chosen after the runs, and the study's records are left as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.report import stats
from anatomy_cli.spec.knobs import Setting
from anatomy_cli.store import records
from anatomy_cli.store.runs import RunError


@dataclass(frozen=True)
class Rules:
    folder: Path
    study: records.StudyRecord | None  # sweep.json
    decide: records.DecideRecord | None
    tune: records.TuneRecord | None
    timing: dict | None
    margin: float  # the loss effects' margin (bits per byte)
    margin_basis: str  # stats.DEFAULT | stats.GIVEN | stats.AFTER ... (the study's)

    @property
    def alpha(self) -> float:
        """Each loss family's family-wise alpha: a --decide study's latest look's (decide.json spends stats.ALPHA
        over its looks)."""
        return self.decide.now if self.decide is not None else stats.ALPHA

    @property
    def spending(self) -> int | list[float]:
        """What the rule's words say of the looks (stats.rule_text): 1 without --decide, else each look's alpha."""
        return self.decide.alphas if self.decide is not None else 1

    @property
    def looks(self) -> int:
        """How many looks the study planned (1 without --decide): what its alpha was split over."""
        return len(self.decide.looks) if self.decide is not None else 1

    @property
    def study_margin(self) -> float | None:
        """The margin the study recorded when it started (None: the default)."""
        return self.study.study_margin if self.study is not None else None

    @property
    def worth_margin(self) -> float | None:
        """The multipliers' margin the study recorded (spec key worth_margin; None: not asked for)."""
        return self.study.worth_margin if self.study is not None else None

    @property
    def invocation(self) -> records.Invocation | None:
        return self.study.invocation if self.study is not None else None

    @property
    def settings(self) -> list[Setting]:
        """The settings the study was asked for with (--set and its aliases), as sweep.json recorded them."""
        return self.invocation.as_settings() if self.invocation is not None else []


def read_rules(folder: Path, margin: float | None = None, studies: dict | None = None) -> Rules:
    """The Rules of a study folder, each of its records read once (its sweep.json taken from `studies` where
    the runs were loaded with it); `margin`, where given and not the study's, judges the loss effects as a
    view (basis stats.AFTER, naming the study's)."""
    folder = Path(folder)
    study = studies[folder] if studies is not None and folder in studies else records.read_study(folder)
    recorded = study.study_margin if study is not None else None
    value, basis = (recorded, stats.GIVEN) if recorded is not None else (stats.DEFAULT_MARGIN, stats.DEFAULT)
    if margin is not None and not math.isclose(margin, value):
        basis = f"{stats.AFTER} (the study's: {value:.3f}{'' if recorded is not None else ', the default'})"
        value = margin
    return Rules(folder, study, records.read_decide(folder), records.read_tune(folder), records.read_timing(folder),
                 value, basis)


def judged_by(root: Path, folders: list[Path], margin: float | None = None, studies: dict | None = None) -> Rules:
    """The Rules that judge the runs under root, whose run folders' parents are `folders`: root's own where
    it is the one study, else the one study folder below it (a report of runs/ judges runs/demo as runs/demo's
    report does). Several studies of one alpha and margin are judged each as itself (effects.groups keeps their
    runs apart) under the Rules of the tuned one among them, if any, whose LR selection and shared-LR runs are
    then told apart from its study's; studies recorded with other alphas or margins, or two tuned studies, are
    not judged as one: refused, naming them (report each study's folder)."""
    if len(folders) <= 1:
        return read_rules(folders[0] if folders else Path(root), margin, studies)
    each = {f: read_rules(f, margin, studies) for f in folders}
    rules = {f: (r.alpha, r.study_margin) for f, r in each.items()}
    if len(set(rules.values())) > 1:
        named = "; ".join(f"{f} (alpha {a:.4g}, margin {m if m is not None else stats.DEFAULT_MARGIN:.3f})"
                          for f, (a, m) in rules.items())
        raise RunError(f"{root} holds studies judged by different rules: {named}: report each study's folder")
    tuned = [f for f, r in each.items() if r.tune is not None]
    if len(tuned) > 1:  # one report holds one LR selection's allowance and comparison
        raise RunError(f"{root} holds {len(tuned)} tuned studies ({', '.join(map(str, tuned))}): report each "
                       f"study's folder")
    return each[tuned[0] if tuned else folders[0]]  # its selection and shared-LR runs told apart from its study's
