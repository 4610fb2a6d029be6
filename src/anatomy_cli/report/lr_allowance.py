"""A tuned study's runs told apart, and the LR selection's own error (no torch).

`anatomy ablate --tune-lr` (study/lr_study.py) trains three kinds of run into one sweep folder, each an
ordinary run whose id is the hash of its config: the selection runs (the LR grid of every config, on
the selection seeds), the study's runs (the study's seeds, each config at its frozen LR) and the
shared-LR runs (the study's seeds at train.lr; where a config's LR did not move, these are its study
runs: the same config, the same id). The seeds tell the selection runs apart (disjoint from every
study seed), the LR the other two (the runs frame's `config` and `lr` columns, read from each run's
config). The verdict is the study's runs; for it, each config's LR is part of the config (the runs of
one comparison train at their own LRs), so their `settings` leave train.lr out, and `tuned` marks them.

  study_runs     a tuned folder's frames narrowed to the study's runs at the frozen LRs (report.build)
  shared_runs    its runs at the shared LR on the study's seeds (the shared-LR comparison)
  selection_runs its selection runs
  arm_of         the config name of a frame of one config's runs
  rerun_flags    the settings that go on with the study (advice commands say them: spec/knobs.py)
  regret_bound   how much worse a frozen LR may be than its config's best (the selection's own error)
  family_sd      the median paired sd of the effects judged together: the floor under each one's own
  allowance      an effect's interval widening for the two configs' regret bounds (stats.judge reads it)

The selection's error. A config frozen at an LR that is not its best trains the study's seeds a little
worse than it could: its regret r >= 0. A gain measured between two frozen configs is then the gain at
their optima plus r(without the component) - r(with it), so a tuned study with seeds enough to see a
regret calls it as the component's worth (benchmarks/calibrate_tuning.py measures how often, against
each config at its optimum: RESULTS.md, "Tuned learning rates: calibration"). Each tuned interval is therefore
widened by a bound on each side's regret: below by the bound of the config without the component (a
gain can be that much smaller at the optima), above by the one with it. The bound, from the config's
selection curve (tune.json) and the effect's own noise, is two parts: the chance that a point the
selection ranked worse is in truth better, z x sigma x sqrt 2 less the chosen point's lead over the
runner-up (sigma: one selection loss's noise, the effect's paired sd, floored at the median of its
family's, / sqrt 2 / sqrt(selection seeds); z = REGRET_Z), and what the grid's step costs where the
optimum lies between points (the quadratic through the chosen point and its neighbours: its value
there minus its vertex's).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd

from anatomy_cli.spec import knobs
from anatomy_cli.store import runs as runs_mod
from anatomy_cli.store.records import TuneRecord

REGRET_Z = 2.0  # the regret bound's one-sided level for a runner-up being in truth better (97.7 %)


def rerun_settings(record: TuneRecord | None) -> list[knobs.Setting]:
    """The settings that go on with a tuned study: tune on where the command line turned it on, each grid
    setting the study was planned with other than its default, and the shared-LR runs off where it was
    planned without them (none for a study not tuned)."""
    from anatomy_cli.spec.config import TuneSpec

    if record is None:
        return []
    default, g = TuneSpec(), record.grid
    out = [knobs.Setting("tune", True, "--tune-lr")] if record.by == "flag" else []
    out += [knobs.Setting(f"tune.{k}", v, "") for k, v in (("points", g.points), ("factor", g.factor),
                                                            ("extend", g.extend)) if v != getattr(default, k)]
    given = record.seeds_given
    if given is not None and given != default.seeds:
        out.append(knobs.Setting("tune.seeds", given, ""))
    return out + ([] if record.shared else [knobs.Setting("tune.shared", False, "")])


def rerun_flags(record: TuneRecord | None) -> list[str]:
    """rerun_settings as command-line words (spec/knobs.py's aliases: '--tune-points', '3')."""
    return knobs.command_args(rerun_settings(record))


def arm_of(runs: pd.DataFrame) -> str | None:
    """The config name of a frame of one config's runs (an effect's end or variant side); None if empty."""
    return runs["config"].iloc[0] if len(runs) else None


def _kinds(runs: pd.DataFrame, folder: Path, record: TuneRecord) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(study, shared, selection) masks over the runs of `folder` (a run of another folder is none)."""
    here = runs["path"].map(lambda p: Path(p).parent == Path(folder))
    chosen = runs["config"].map(record.chosen)
    selection = here & runs["seed"].isin(record.seeds)
    study = here & chosen.notna() & (runs["lr"] == chosen) & ~selection
    shared = here & ~selection & runs["config"].isin(record.chosen) & (runs["lr"] == record.grid.center)
    return study, shared, selection


def study_runs(runs: pd.DataFrame, curves: pd.DataFrame, folder: Path, record: TuneRecord | None
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frames a report judges: unchanged without tune.json in `folder` (record None); with it, the runs of
    other folders and the study's runs at their configs' frozen LRs (their settings without train.lr, so the
    configs of one comparison pair across their LRs, and `tuned` true), their curves only. The selection
    and shared-LR runs are read by report/lr_comparison.py."""
    if record is None or runs.empty:
        return runs, curves
    here = runs["path"].map(lambda p: Path(p).parent == Path(folder))
    study, _, _ = _kinds(runs, folder, record)
    if not study.any():
        raise runs_mod.RunError(f"{folder} is a tuned study with no runs at its chosen LRs yet (tune.json"
                                f"{': every LR still to choose' if not record.arms else ''}): rerun its ablate to "
                                f"go on")
    keep = runs[study | ~here].copy()
    keep["tuned"] = study[study | ~here]
    keep.loc[keep["tuned"], "settings"] = keep.loc[keep["tuned"], "settings"].map(without_lr)
    return keep, curves[curves["run_id"].isin(keep["run_id"])]


def without_lr(settings: str) -> str:
    """A runs frame's settings without train.lr: a tuned study's configs each train at their own."""
    return json.dumps({k: v for k, v in json.loads(settings).items() if k != "train.lr"}, sort_keys=True,
                      default=str)


def shared_runs(runs: pd.DataFrame, folder: Path, record: TuneRecord) -> pd.DataFrame:
    """The runs of `folder` at the shared LR (the grid's center) on the study's seeds: the shared-LR study."""
    return runs[_kinds(runs, folder, record)[1]]


def selection_runs(runs: pd.DataFrame, folder: Path, record: TuneRecord) -> pd.DataFrame:
    """The selection runs of `folder` (the selection seeds)."""
    return runs[_kinds(runs, folder, record)[2]]


def lr_text(lr: float | None) -> str:
    """The LR to 3 significant digits as %g writes it ('0.003', '0.00025', '4e-05'), or 'not tuned'."""
    return "not tuned" if lr is None or not math.isfinite(lr) else f"{lr:.3g}"


def regret_bound(lrs, losses, lr: float | None, sigma: float, z: float = REGRET_Z) -> float:
    """The bound (nats, >= 0) on how much worse a config's frozen LR `lr` trains than its best LR: its
    selection curve (ascending `lrs`, the mean selection `losses` there), chosen by the argmin (an inner
    point), with `sigma` the noise of one selection loss. NaN where the config is not tuned or sigma is
    unknown. max(0, z sigma sqrt 2 - the lead of the chosen point over the best other point) + the grid's
    step cost, (below - above)^2 / (8 (below - 2 best + above)): the quadratic through the chosen point and
    its neighbours, its value at the point minus its vertex's (0 on a flat or concave triple)."""
    if lr is None or not (math.isfinite(sigma) and sigma >= 0) or lr not in lrs:
        return math.nan
    i = list(lrs).index(lr)
    if not 0 < i < len(lrs) - 1:
        return math.nan
    best = float(losses[i])
    lead = min(float(v) for j, v in enumerate(losses) if j != i) - best
    below, above = float(losses[i - 1]), float(losses[i + 1])
    curve = below - 2 * best + above
    step = (below - above) ** 2 / (8 * curve) if curve > 0 else 0.0
    return max(0.0, z * sigma * math.sqrt(2) - lead) + step


def family_sd(sds) -> float:
    """The median of a family's finite paired sds (NaN for none): the floor under each effect's own sd in
    its allowance (allowance's `floor`)."""
    finite = [float(x) for x in sds if x is not None and math.isfinite(x)]
    return statistics.median(finite) if finite else math.nan


def allowance(record: TuneRecord, end: str | None, variant: str | None, add_one: bool, sd: float,
              floor: float = math.nan, scale: float = 1.0) -> dict:
    """{allow_low, allow_high}: how far an effect's interval (end arm vs variant arm, paired sd `sd` on the
    study's seeds) is widened for the selection's error, below by the regret bound of the config without
    the component, above by the one with it (stats.judge subtracts and adds them); NaN when unknown.
    The noise is the larger of `sd` and `floor` (family_sd of the effects judged with it): at 3 seeds an
    effect's own sd is often far below its truth, and its interval is narrow exactly then, so an allowance
    from that sd alone shrinks where the false calls are (RESULTS.md: 5.5 % in "flatter curve"). `scale`: the
    effect's unit per nat of the selection losses (tune.json's are nats per token; the report judges bits per
    byte, the runs' bpb_per_nat), so the bound is in the effect's unit."""
    sd = max((x for x in (sd, floor) if math.isfinite(x)), default=math.nan)
    sigma = sd / math.sqrt(2 * len(record.seeds)) if math.isfinite(sd) else math.nan
    bound = {}
    for name in (end, variant):
        arm = record.arm(name) if name is not None else None
        bound[name] = (regret_bound(arm.lrs, [loss * scale for loss in arm.losses], arm.lr, sigma)
                       if arm is not None else math.nan)
    without, with_ = (end, variant) if add_one else (variant, end)
    return {"allow_low": bound[without], "allow_high": bound[with_]}


def is_tuned(members: pd.DataFrame) -> bool:
    """Whether `members` are one tuned study's runs at their frozen LRs (study_runs' `tuned`), whose effects
    the LR selection's error widens; a shared-LR study or any other runs are not."""
    return bool(len(members)) and "tuned" in members and bool(members["tuned"].fillna(False).astype(bool).all())
