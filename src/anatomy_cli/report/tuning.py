"""A tuned study's record, tune.json, and which of its folder's runs are which (no torch).

`anatomy ablate --tune-lr` (study/tuned.py) trains three kinds of run into one sweep folder, each an
ordinary run whose id is the hash of its config: the selection runs (the LR grid of every config, on
the selection seeds), the study's runs (the study's seeds, each config at its frozen LR) and the
shared-LR runs (the study's seeds at train.lr; where a config's LR did not move, these are its study
runs: the same config, the same id). The seeds tell the selection runs apart (disjoint from every
study seed), the LR the other two. The verdict is the study's runs; for it, each config's LR is part
of the config (the runs of one comparison train at their own LRs), so their `settings` say
train.lr = "tuned" and they pair as one group.

  TuneRecord     RUNS_DIR/tune.json: the grid, the selection seeds, the rule, each config's choice
  read_record / write_record   the file, checked whole / atomically
  rerun_flags    the ablate options that go on with the study (advice commands say them)
  slug_of        a run's config name (its slug) from its run id
  arm_of         the config name of a frame of one config's runs
  study_runs     a tuned folder's frames narrowed to the study's runs at the frozen LRs (report_frames)
  shared_runs    its runs at the shared LR on the study's seeds (the shared-LR comparison)
  selection_runs its selection runs
  regret_bound   how much worse a frozen LR may be than its config's best (the selection's own error)
  family_sd      the median paired sd of the effects judged together: the floor under each one's own
  allowance      an effect's interval widening for the two configs' regret bounds (stats.judge reads it)
  tuned_record   the tune.json of a group of study runs at their frozen LRs (None for any other runs)

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
import re
import statistics
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import Field, model_validator

from anatomy_cli.store import runs as runs_mod

TUNE = "tune.json"
REGRET_Z = 2.0  # the regret bound's one-sided level for a runner-up being in truth better (97.7 %)
TUNED = "tuned"  # the train.lr of a study run's settings: its config's own, frozen LR
RUN_ID = re.compile(r"^(?P<slug>.+)-s(?P<seed>-?\d+)-[0-9a-f]{8}$")

Lr = Annotated[float, Field(gt=0)]
Loss = Annotated[float, Field(ge=0)]


class TuneGrid(runs_mod.FileModel):
    """The LR grid: `points` LRs center x factor^k (k = -points//2 .. +points//2), up to `extend` more past
    the edge an arm's best lands on."""

    center: Lr
    points: Annotated[int, Field(ge=3)]
    factor: Annotated[float, Field(gt=1)]
    extend: Annotated[int, Field(ge=0)]


class TuneArm(runs_mod.FileModel):
    """One config's selection: the LRs it trained (ascending, extensions included), its selection loss at
    each (the mean over the selection seeds of the capped best val loss), the LR chosen (None: not tuned)
    and why, its best loss and its sensitivity (mean over the grid's points of min(loss, initial loss)
    minus the best). config: the hash of its config without seed and LR (a changed config is refused)."""

    arm: str
    config: str
    lrs: list[Lr]
    losses: list[Loss]
    lr: Lr | None
    tuned: bool
    reason: str
    best_loss: Loss
    sensitivity: Annotated[float, Field(ge=0)]
    extended: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _whole(self) -> TuneArm:
        if len(self.lrs) != len(self.losses) or self.lrs != sorted(self.lrs):
            raise ValueError(f"{self.arm}: lrs and losses are not one ascending grid")
        if self.tuned != (self.lr is not None) or (self.lr is not None and self.lr not in self.lrs):
            raise ValueError(f"{self.arm}: a tuned arm's lr is one of its lrs, an untuned arm has none")
        return self


class TuneRecord(runs_mod.FileModel):
    """tune.json: the grid and selection seeds the study was planned with (written before the first
    selection run trains, so a rerun with another grid is refused), the rule in words, the initial loss
    a diverged run counts at, what turned tuning on, whether the study's seeds also train at the shared LR
    (shared; absent in files written before it: true), and each config's choice (filled in once its grid
    is trained: from then on frozen)."""

    grid: TuneGrid
    seeds: Annotated[list[int], Field(min_length=1)]
    rule: str
    initial_loss: Annotated[float, Field(gt=0)]
    by: Literal["flag", "spec"] | None = None
    seeds_given: Annotated[int, Field(ge=1)] | list[int] | None = None  # as asked: a count, or a list
    shared: bool = True  # the shared-LR runs beside the study where an LR moved ([tune] shared)
    arms: list[TuneArm] = []

    @model_validator(mode="after")
    def _distinct(self) -> TuneRecord:
        names = [a.arm for a in self.arms]
        if len(set(names)) != len(names) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("an arm or a selection seed is listed twice")
        return self

    @property
    def chosen(self) -> dict[str, float | None]:
        """{arm: frozen LR, None where not tuned}."""
        return {a.arm: a.lr for a in self.arms}

    def arm(self, name: str) -> TuneArm | None:
        return next((a for a in self.arms if a.arm == name), None)


def read_record(root: Path) -> TuneRecord | None:
    """The study's tune.json, or None when it was not tuned."""
    return runs_mod.read_record(root, TUNE, TuneRecord)


def write_record(root: Path, record: TuneRecord) -> None:
    """tune.json, atomically (the plan goes down before the first selection run: the folder may be new)."""
    runs_mod.write_record(root, TUNE, record)


def rerun_flags(root: Path) -> list[str]:
    """The ablate options that go on with a tuned study at root: --tune-lr where the flag turned it on, and
    each grid option the study was planned with other than its default, and --no-tune-shared where it was
    planned without the shared-LR runs (none for a study not tuned)."""
    from anatomy_cli.spec.config import TuneSpec

    record = read_record(root)
    if record is None:
        return []
    default, g = TuneSpec(), record.grid
    out = ["--tune-lr"] if record.by == "flag" else []
    out += ["--tune-points", str(g.points)] if g.points != default.points else []
    out += ["--tune-factor", f"{g.factor:g}"] if g.factor != default.factor else []
    out += ["--tune-extend", str(g.extend)] if g.extend != default.extend else []
    given = record.seeds_given
    if given is not None and given != default.seeds:
        out += ["--tune-seeds", str(given) if isinstance(given, int) else ",".join(map(str, given))
                + ("," if len(given) == 1 else "")]
    return out + ([] if record.shared else ["--no-tune-shared"])


def slug_of(run_id: str) -> str | None:
    """'2017+rope' of '2017+rope-s1337-0a1b2c3d' (runs.run_id's form); None for a name of another form."""
    m = RUN_ID.match(Path(run_id).name)
    return m.group("slug") if m else None


def arm_of(runs: pd.DataFrame) -> str | None:
    """The config name (slug) of a frame of one config's runs (an effect's end or variant side); None if empty."""
    return slug_of(Path(runs["path"].iloc[0]).name) if len(runs) else None


def _lr(settings: str) -> float | None:
    value = json.loads(settings).get("train.lr")
    return float(value) if isinstance(value, (int, float)) else None


def _kinds(runs: pd.DataFrame, folder: Path, record: TuneRecord) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(study, shared, selection) masks over the runs of `folder` (a run of another folder is none)."""
    here = runs["path"].map(lambda p: Path(p).parent == Path(folder))
    slugs = runs["path"].map(lambda p: slug_of(Path(p).name))
    lrs = runs["settings"].map(_lr)
    chosen = record.chosen
    picked = [here.iloc[i] and chosen.get(slugs.iloc[i]) is not None and lrs.iloc[i] == chosen[slugs.iloc[i]]
              for i in range(len(runs))]
    selection = here & runs["seed"].isin(record.seeds)
    study = pd.Series(picked, index=runs.index, dtype=bool) & ~selection
    shared = here & ~selection & slugs.isin(chosen) & (lrs == record.grid.center)
    return study, shared, selection


def study_runs(runs: pd.DataFrame, curves: pd.DataFrame, folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frames a report judges: unchanged without tune.json in `folder`; with it, the runs of other
    folders and the study's runs at their configs' frozen LRs (settings' train.lr = TUNED, so the configs
    of one comparison pair across their LRs), their curves only. The selection and shared-LR runs are
    read by report/fair_lr.py."""
    record = read_record(folder)
    if record is None or runs.empty:
        return runs, curves
    here = runs["path"].map(lambda p: Path(p).parent == Path(folder))
    study, _, _ = _kinds(runs, folder, record)
    if not study.any():
        raise runs_mod.RunError(f"{folder} is a tuned study with no runs at its chosen LRs yet (tune.json"
                                f"{': every LR still to choose' if not record.arms else ''}): rerun its ablate to "
                                f"go on")
    keep = runs[study | ~here].copy()
    tuned = study[study | ~here]
    keep.loc[tuned, "settings"] = keep.loc[tuned, "settings"].map(
        lambda s: json.dumps({**json.loads(s), "train.lr": TUNED}, sort_keys=True, default=str))
    return keep, curves[curves["run_id"].isin(keep["run_id"])]


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
              floor: float = math.nan) -> dict:
    """{allow_low, allow_high}: how far an effect's interval (end arm vs variant arm, paired sd `sd` on the
    study's seeds) is widened for the selection's error, below by the regret bound of the config without
    the component, above by the one with it (stats.judge subtracts and adds them); NaN when unknown.
    The noise is the larger of `sd` and `floor` (family_sd of the effects judged with it): at 3 seeds an
    effect's own sd is often far below its truth, and its interval is narrow exactly then, so an allowance
    from that sd alone shrinks where the false calls are (RESULTS.md: 5.5 % in "flatter curve")."""
    sd = max((x for x in (sd, floor) if math.isfinite(x)), default=math.nan)
    sigma = sd / math.sqrt(2 * len(record.seeds)) if math.isfinite(sd) else math.nan
    bound = {}
    for name in (end, variant):
        arm = record.arm(name) if name is not None else None
        bound[name] = regret_bound(arm.lrs, arm.losses, arm.lr, sigma) if arm is not None else math.nan
    without, with_ = (end, variant) if add_one else (variant, end)
    return {"allow_low": bound[without], "allow_high": bound[with_]}


def tuned_record(members: pd.DataFrame) -> TuneRecord | None:
    """The tune.json of `members` when they are one tuned study's runs at their frozen LRs (study_runs' frame:
    settings' train.lr = TUNED, one folder); None for any other runs (a shared-LR study included)."""
    if members.empty or not members["settings"].map(lambda s: json.loads(s).get("train.lr") == TUNED).all():
        return None
    folders = {Path(p).parent for p in members["path"]}
    return read_record(folders.pop()) if len(folders) == 1 else None
