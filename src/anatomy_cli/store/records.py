"""A study's records (no torch): the files a study writes into its sweep folder before and while it trains, each
typed once here and read by one function (a corrupt one is one RunError line naming file and field).

  sweep.json   StudyRecord   the design's components, the size ladder, how the study was asked for
                             (Invocation: spec and settings) and its margin, fixed when the study starts
  decide.json  DecideRecord  --decide's looks, their alpha, and each round (report/decide.py)
  tune.json    TuneRecord    --tune-lr's grid, selection seeds, rule, each config's frozen LR
  timing.json  TimingRecord  the timing pass's rounds (`ablate --time`, sweep/timing.py)

  read_study / write_study, read_decide / write_decide, read_tune / write_tune, read_timing / write_timing
  merged_study  sweep.json as one more study of the same folder leaves it (components and sizes united)

The margin. The smallest loss effect that matters is fixed before the data: the folder's first study records
it (or none: the default) and every later one must ask for the same; another margin is a view of the same
runs (`anatomy report DIR --margin M` writes beside the study's report), never a rewrite of this record.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from anatomy_cli.spec.config import ALPHA, MAX_MARGIN, ConfigError, Margin, check_margin
from anatomy_cli.spec.knobs import Setting
from anatomy_cli.store.runs import (
    SWEEP,
    TIMING,
    FileModel,
    RunError,
    atomic_write_json,
    read_json,
    read_record,
    schema_problem,
    write_record,
)

DECIDE, TUNE = "decide.json", "tune.json"
Count = Annotated[int, Field(ge=0)]


# --------------------------------------------------------------------------- sweep.json


class SettingRecord(FileModel):
    key: str
    value: Any = None
    typed: str = ""
    extend: bool | None = None  # true: added to the spec's list (--plugin FILE), not put in its place


class Invocation(FileModel):
    """How the study was asked for: its spec (None: the default) and the settings laid over it. Folders from
    before settings existed record flip and steps (and min_effect) instead: as_settings() reads them alike."""

    spec: str | None = None
    settings: list[SettingRecord] = None
    flip: str | None = None
    steps: Annotated[int, Field(gt=0)] | None = None

    def as_settings(self) -> list[Setting]:
        if self.settings is not None:
            return [Setting(s.key, s.value, s.typed, bool(s.extend)) for s in self.settings]
        out = [Setting("only", self.flip.split(","), f"--flip {self.flip}")] if self.flip else []
        return out + ([Setting("base.train.steps", self.steps, f"--steps {self.steps}")] if self.steps else [])


class StudyRecord(FileModel):
    """sweep.json: the components the folder's runs were planned with (components.record rows), its size
    ladder, how its study was asked for, and its margin (absent: the default; files from before it was typed
    have their invocation's min_effect)."""

    components: list[dict]
    sizes: list[dict] = []
    invocation: Invocation | None = None
    margin: Margin | None = None
    worth_margin: Annotated[float, Field(gt=1, le=MAX_MARGIN)] | None = None  # asks for the multipliers
    budgets: list[Annotated[int, Field(gt=0)]] = []  # a budget ladder's budgets (train steps), [budgets]

    @model_validator(mode="after")
    def _sizes(self) -> StudyRecord:
        if not all(isinstance(s.get("name"), str) and isinstance(s.get("settings"), dict) for s in self.sizes):
            raise ValueError("sizes is not a list of {name, settings}")
        if self.margin is None and self._legacy is not None:  # an older file's margin: checked as a margin is
            try:
                check_margin(self._legacy, "invocation.min_effect")
            except ConfigError as err:
                raise ValueError(str(err)) from None
        return self

    @property
    def _legacy(self) -> Any:
        """An older invocation's min_effect (the margin before it was typed), as the file holds it."""
        return (self.invocation.model_extra or {}).get("min_effect") if self.invocation else None

    @property
    def study_margin(self) -> float | None:
        """The margin the study was planned with: the typed one, else an older invocation's min_effect (checked
        as the typed one is when the file is read), else None (the default)."""
        if self.margin is not None:
            return self.margin
        return float(self._legacy) if self._legacy is not None else None


def read_study(folder: Path) -> StudyRecord | None:
    """The folder's sweep.json, or None when it has none."""
    path = Path(folder) / SWEEP
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("components"), list):
        raise RunError(f"corrupt {SWEEP} in {Path(folder)}: no components list")
    try:
        return StudyRecord.model_validate(data)
    except ValidationError as err:
        raise RunError(f"corrupt {SWEEP} in {Path(folder)}: {schema_problem(err)}") from None


def merged_study(folder: Path, components: list[dict], sizes: list[dict], invocation: Invocation | None,
                 margin: float | None, worth_margin: float | None = None, budgets: list[int] = ()) -> StudyRecord:
    """sweep.json as one more study of `folder` leaves it: the union of every study's components and sizes
    (a spec component or a size redefined under the same name is refused: the runs already written were
    planned with the old definition), the latest invocation, and the margin of the folder's first study
    (a later one asks for the same: study.ablation refuses another); the latest worth margin asked for."""
    old = read_study(folder)
    rows = {r["name"]: r for r in (old.components if old else [])}
    for row in components:
        if row.get("origin") != "built-in" and row["name"] in rows and rows[row["name"]] != row:
            raise ConfigError(f"{Path(folder) / SWEEP}: component {row['name']} was defined differently by an "
                              f"earlier sweep in this directory; rename it or use another spec name")
        rows.setdefault(row["name"], row)
    rungs = {r["name"]: r for r in (old.sizes if old else [])}
    for size in sizes:
        if rungs.setdefault(size["name"], size) != size:
            raise ConfigError(f"{Path(folder) / SWEEP}: size {size['name']} was defined differently by an earlier "
                              f"sweep in this directory; rename it or use another spec name")
    return StudyRecord(components=list(rows.values()), sizes=list(rungs.values()),
                       invocation=invocation if invocation is not None else old.invocation if old else None,
                       margin=old.study_margin if old is not None else margin,
                       worth_margin=worth_margin if worth_margin is not None else old.worth_margin if old else None,
                       budgets=sorted(set(budgets) | set(old.budgets if old else ())),
                       **{k: v for k, v in ((old.model_extra or {}) if old else {}).items()})


def write_study(folder: Path, record: StudyRecord) -> None:
    """sweep.json, atomically (keys at None left out, as the file has always been written)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    data = record.model_dump(mode="json", exclude_none=True)
    atomic_write_json(Path(folder) / SWEEP, {k: v for k, v in data.items() if k not in ("sizes", "budgets") or v})


# --------------------------------------------------------------------------- decide.json


def equal_alpha(looks: list[int]) -> float:
    """Each look's family-wise alpha: ALPHA split equally over the planned looks (report/decide.py says why)."""
    return ALPHA / max(1, len(looks))


def late_spending(looks: list[int]) -> list[float]:
    """Each look's family-wise alpha, spent late (report/decide.py says why): the final look LATE_SHARE of ALPHA,
    the earlier looks the rest in proportion to their order (1, 2, ..., K - 1): at looks 3, 5, 7, 9, 10 seeds
    0.002, 0.004, 0.006, 0.008 and 0.03; one look: all of ALPHA."""
    k = len(looks)
    if k <= 1:
        return [ALPHA] * k
    early = ALPHA * (1 - LATE_SHARE) / (k * (k - 1) / 2)
    return [round(early * (i + 1), 12) for i in range(k - 1)] + [round(ALPHA * LATE_SHARE, 12)]  # as decide.json reads


LATE_SHARE = 0.6  # the final look's share of ALPHA under late spending


class Round(FileModel):
    """One look of decide.json: its seed count, the runs its round trained, how long it took, the effects
    it left open and those of them it found futile."""

    seeds: Annotated[int, Field(ge=1)]
    trained: Annotated[int, Field(ge=0)]
    seconds: Annotated[float, Field(ge=0)]
    open: list[str]
    futile: list[str] = []


class DecideRecord(FileModel):
    """decide.json: the looks planned, each look's alpha (`spending`: ALPHA spent over them, their sum at most
    ALPHA; files from before it record one `alpha`, ALPHA split equally), the margin the study was planned
    with (None: the default), what turned the rounds on, the rounds run and why the study stopped."""

    looks: list[Annotated[int, Field(ge=1)]]
    alpha: Annotated[float, Field(gt=0, le=1)] | None = None  # older files: every look's (equal split)
    spending: list[Annotated[float, Field(gt=0, le=1)]] | None = None  # each look's family-wise alpha
    margin: Margin | None = None
    by: Literal["flag", "spec"] | None = None  # the command line (--decide, --set decide...) or the spec's table
    rounds: list[Round] = []
    stopped: str | None = None

    @model_validator(mode="after")
    def _planned(self) -> DecideRecord:
        if not self.looks or self.looks != sorted(set(self.looks)):
            raise ValueError(f"looks {self.looks} are not increasing seed counts")
        if self.spending is None:
            if self.alpha is None:
                raise ValueError("neither spending (each look's alpha) nor alpha")
            if not math.isclose(self.alpha, equal_alpha(self.looks), rel_tol=1e-9):
                raise ValueError(f"alpha {self.alpha:g} is not {ALPHA:g} split over the {len(self.looks)} looks "
                                 f"({equal_alpha(self.looks):.4g})")
        else:
            if len(self.spending) != len(self.looks):
                raise ValueError(f"spending has {len(self.spending)} alphas for {len(self.looks)} looks")
            if sum(self.spending) > ALPHA * (1 + 1e-9):
                raise ValueError(f"spending {self.spending} adds up to {sum(self.spending):.4g}, more than {ALPHA:g}")
            if self.spending != sorted(self.spending):
                raise ValueError(f"spending {self.spending} falls from one look to the next")
            if self.alpha is not None and not math.isclose(self.alpha, self.spending[-1], rel_tol=1e-9):
                raise ValueError(f"alpha {self.alpha:g} is not the final look's {self.spending[-1]:.4g}")
        if [r.seeds for r in self.rounds] != self.looks[:len(self.rounds)]:
            raise ValueError(f"rounds at {[r.seeds for r in self.rounds]} seeds are not the looks {self.looks}")
        return self

    @property
    def alphas(self) -> list[float]:
        """Each look's family-wise alpha (an older file's: its one alpha at every look)."""
        return list(self.spending) if self.spending is not None else [self.alpha] * len(self.looks)

    @property
    def equal(self) -> bool:
        """Whether every look has the same alpha (ALPHA split equally: every file from before `spending`)."""
        return len(set(self.alphas)) == 1

    @property
    def now(self) -> float:
        """The alpha of the latest look judged (the first before any): what a report of the folder judges at.
        Spending never falls from one look to the next, so a look's runs judged at it are covered by the union
        bound (its intervals hold the next look's, which is one of the events that bound counts)."""
        return self.alphas[max(0, len(self.rounds) - 1)]


def read_decide(folder: Path) -> DecideRecord | None:
    """The study's decide.json, or None when it was not run in rounds."""
    return read_record(folder, DECIDE, DecideRecord)


def write_decide(folder: Path, record: DecideRecord) -> None:
    """decide.json, atomically (the plan is written before the first round trains: the folder may be new)."""
    write_record(folder, DECIDE, record)


# --------------------------------------------------------------------------- tune.json

Lr = Annotated[float, Field(gt=0)]
Loss = Annotated[float, Field(ge=0)]


class TuneGrid(FileModel):
    """The LR grid: `points` LRs center x factor^k (k = -points//2 .. +points//2), up to `extend` more past
    the edge an arm's best lands on."""

    center: Lr
    points: Annotated[int, Field(ge=3)]
    factor: Annotated[float, Field(gt=1)]
    extend: Annotated[int, Field(ge=0)]


class TuneArm(FileModel):
    """One config's selection: the LRs it trained (ascending, extensions included), its selection loss at
    each (the mean over the selection seeds of the capped best val loss), the LR chosen (None: not tuned)
    and why, its best loss and its sensitivity (mean over the grid's points of min(loss, initial loss)
    minus the best). config_hash (the file's "config"): the hash of its config without seed and LR (a
    changed config is refused)."""

    arm: str
    config_hash: str = Field(alias="config")
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


class TuneRecord(FileModel):
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


def read_tune(folder: Path) -> TuneRecord | None:
    """The study's tune.json, or None when it was not tuned."""
    return read_record(folder, TUNE, TuneRecord)


def write_tune(folder: Path, record: TuneRecord) -> None:
    """tune.json, atomically (the plan goes down before the first selection run: the folder may be new); the
    file keeps its own key names ("config" for an arm's config_hash)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(folder) / TUNE, record.model_dump(mode="json", by_alias=True))


# --------------------------------------------------------------------------- timing.json


class TimedConfig(FileModel):
    slug: str
    role: str  # components.role's kind: reference, all-on, add-one, remove-one, other
    flip: str | None  # the component an add-one / remove-one config flips; null for the ends
    group: str = ""


class TimingRecord(FileModel):
    steps: Count
    warmup: Count
    rounds: Count = None
    threads: Annotated[int, Field(ge=1)]
    ends: Annotated[list[str], Field(min_length=2, max_length=2)] = None
    configs: list[TimedConfig]
    rounds_data: list[dict[str, Annotated[float, Field(ge=0)]]]  # per round {slug: tokens/s}


def read_timing(folder: Path) -> dict | None:
    """The timing record as written (a plain dict), checked against TimingRecord; None without one."""
    path = Path(folder) / TIMING
    if not path.is_file():
        return None
    record = read_json(path)
    try:
        TimingRecord.model_validate(record)
    except ValidationError as err:
        raise RunError(f"corrupt {TIMING} in {Path(folder)}: {schema_problem(err, ('rounds_data',))}") from None
    return record


def write_timing(folder: Path, record: dict) -> Path:
    path = Path(folder) / TIMING
    Path(folder).mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    return path
