"""The report, computed once (no torch): one frozen Report, built by one function from a folder of runs, then
read by every output (the terminal's verdict, report.md/.html, report.json and `report --json`, the results
file), none of which computes anything of its own.

  Report        the study's rules, the runs (as loaded, and as judged), curves, effects (loss and speed),
                the verdicts, effects over training, the size ladder, a tuned study's comparison, the calls
                across tokenizers, the ladder's multipliers (report/ladder.py)
  build_report  a folder -> its Report: each study record read once (report/rules.py), the runs loaded once
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from anatomy_cli.report import across_tokenizers, frames, lr_allowance, lr_comparison, plateau, rules, scale
from anatomy_cli.report import effects as effects_mod
from anatomy_cli.report import ladder as ladder_mod
from anatomy_cli.report import verdict as vd
from anatomy_cli.report.frames import LOSS_METRIC, SPEED_METRIC
from anatomy_cli.spec import components as comp
from anatomy_cli.store import records


@dataclass(frozen=True)
class Report:
    root: Path
    rules: rules.Rules  # the study's records and the judging they make (margin, alpha, looks)
    studies: dict  # {study folder: its sweep.json record or None}, as the runs were loaded with them
    everything: pd.DataFrame  # every run under root (a tuned study's selection and shared-LR runs included)
    runs: pd.DataFrame  # the runs judged (a tuned study's at their frozen LRs)
    curves: pd.DataFrame
    effects: pd.DataFrame  # loss and speed, told apart by `metric`
    verdict: pd.DataFrame  # the loss effects ranked (verdict.verdict_frame)
    speed_verdict: pd.DataFrame
    eval_effects: pd.DataFrame  # each loss effect at every evaluation (effects.effects_by_eval)
    scale: scale.Scale | None  # a size ladder's effects by size and trends
    tuning: lr_comparison.Tuned | None  # a tuned study's LRs and its shared-LR comparison
    tokenizers: list[dict] = ()  # each loss call at every tokenizer, and what they say together (across_tokenizers)
    ladder: ladder_mod.Ladder | None = None  # a ladder's multipliers (or the line why none), report/ladder.py

    @property
    def loss(self) -> pd.DataFrame:
        return self.effects[self.effects["metric"] == LOSS_METRIC]

    @property
    def components(self) -> dict[str, comp.Component]:
        """The components of every study under the runs, by name."""
        return frames.components_of(self.runs, self.studies)


def build_report(root: Path, margin: float | None = None, worth_margin: float | None = None) -> Report:
    """Every run under root judged by its study's Rules (`margin`, where given and not the study's: a view at
    another margin): the records read once, the runs loaded once, every frame computed once. worth_margin:
    the multipliers' margin asked for now (else the study's worth_margin; either asks for the multipliers,
    so a ladder no law fits is refused, worth.LadderError)."""
    root, studies = Path(root), {}
    everything, curves = frames.load_runs(root, studies)  # fills in each study folder's sweep.json, read once
    folders = sorted(studies)
    judge = rules.judged_by(root, folders, margin, studies)
    runs, curves = lr_allowance.study_runs(everything, curves, judge.folder, judge.tune)
    timing = judge.timing if len(folders) == 1 else records.read_timing(root)
    effects = effects_mod.study_effects(runs, judge, timing)
    runs = plateau.entered(runs, effects)  # each run marked with the effects it enters (plateau runs)
    loss, speed = (effects[effects["metric"] == m] for m in (LOSS_METRIC, SPEED_METRIC))
    return Report(root, judge, studies, everything, runs, curves, effects, vd.verdict_frame(loss),
                  vd.verdict_frame(speed), effects_mod.effects_by_eval(runs, curves),
                  scale.scale_frames(runs, curves, effects, studies),
                  lr_comparison.tuned_frames(everything, runs, effects, judge),
                  across_tokenizers.across(loss, across_tokenizers.tokenizer_of(runs)),
                  _ladder(runs, judge, worth_margin))


def _ladder(runs: pd.DataFrame, judge: rules.Rules, worth_margin: float | None) -> ladder_mod.Ladder | None:
    """The study's ladder at the worth margin asked for (now, or when the study was planned), at its alpha."""
    asked = worth_margin if worth_margin is not None else judge.worth_margin
    budgets = judge.study.budgets if judge.study is not None else []
    return ladder_mod.study_ladder(runs, asked, asked is not None, judge.alpha, budgets)
