"""A study's results file: its typed model and its reader (no torch).

`anatomy report RUNS_DIR --results PATH` writes one (report/results_build.py); the README's and docs' numbers
are rendered from it (report/results_blocks.py). This module is what the file is.

  ResultsFile   the file's model (FORMAT, VERSION): every key typed, each part mirroring the frame it holds
  load          a results file, checked whole against ResultsFile, as its plain dict
  is_results    whether a file is one (the only kind of file --results replaces)

The file (FORMAT, VERSION 1): study, runs {total, completed}, seeds, budget, ends {role: {name,
mean, sd, seeds, best_step, last_step, final}}, effects [{metric, unit, flip, direction, against,
group, n_pairs, gain, adj_low, adj_high, adj_level, family, threshold, threshold_basis, call,
raw_low, raw_high, p_holm, mde, noise, df, allow_low, allow_high (a tuned study's LR allowance), note}],
eval_gains [{flip, direction, group, steps, tokens, gain}] (val-loss gain at every evaluation);
configs [{role, params, active_params, state_bytes_4k, positions}] (what each config costs);
with sizes, scale {budget, sizes, effects, trends} (scale.Scale.record's rows); with --decide, decide
(decide.json); with a ladder, worth {axis, rungs, note, margin, laws, multipliers, trends} (report/ladder.py's
record: worth.LAW_COLUMNS, worth.WORTH_COLUMNS and the multipliers' trends; only axis, rungs and the note
where no law fits); with --tune-lr, tuning {grid {center, points, factor, extend}, seeds (the selection seeds),
arms [{name, lr, best_loss, sensitivity, reason, lrs}] (lr null: not tuned), comparison
[lr_comparison.COMPARISON_COLUMNS]} (lr_comparison.tuned_frames' record and comparison); with several
tokenizers, tokenizers [{flip, direction, tokenizers, calls, gains, intervals, across}] (across_tokenizers.across).
No curves, no paths.
Readers ignore keys they do not know; VERSION changes only when a key's meaning does, and a reader
refuses a newer version by name. A reader checks every key it knows (ResultsFile): a key may be absent
(files written before it existed; a block that needs it says so), but one that is present has its type,
null only where the writer writes null, no NaN, no negative count. The margin's keys are `threshold`
and `threshold_basis` (their names in every file written so far: frames.FILE_NAMES).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from anatomy_cli.spec.errors import InputError
from anatomy_cli.store.records import DecideRecord, TuneGrid
from anatomy_cli.store.runs import FileModel, json_object, schema_problem

FORMAT, VERSION = "anatomy-results", 1
EFFECT_KEYS = ("metric", "unit", "flip", "direction", "against", "group", "n_pairs", "gain", "adj_low", "adj_high",
               "adj_level", "family", "threshold", "threshold_basis", "call", "raw_low", "raw_high", "p_holm",
               "mde", "noise", "df", "allow_low", "allow_high", "note")


# The loss effects' metric and its unit: bits per byte, or in files written before it was the unit, nats per
# character (their numbers render as the file holds them, in its own unit; `anatomy rejudge` converts them).
LOSS_UNITS = {"best_val_bpb": "bits/byte", "best_val_loss": "nats/char"}


def unit_of(doc: dict) -> str:
    """The unit of a results file's losses: its "unit", else its loss effects' metric's, else (a file from before
    either, with no loss effect: the seed protocol's) nats per character."""
    if isinstance(doc.get("unit"), str):
        return doc["unit"]
    return next((LOSS_UNITS[e["metric"]] for e in doc.get("effects") or [] if e.get("metric") in LOSS_UNITS),
                LOSS_UNITS["best_val_loss"])


class ResultsError(InputError):
    """A results file or a marked block that cannot be read or rendered."""


# Every key may be absent (= None: not validated); present, it has its type. `| None`: null written
# for a value that could not be measured. Count: an integer >= 0. Amount: a number >= 0 from a table
# column (an integer, or a float where the column had gaps). Share: a probability or a level, 0 to 1.

Count = Annotated[int, Field(ge=0)]
Amount = Annotated[float, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]
Lr = Annotated[float, Field(gt=0)]


class RunCounts(FileModel):
    total: Count = None
    completed: Count = None


class Budget(FileModel):  # verdict.budget
    reference: Amount | None = None  # each end's mean best val loss
    all_on: Amount | None = Field(None, alias="all-on")
    reference_best_step: Count = None
    all_on_best_step: Count = Field(None, alias="all-on_best_step")
    steps: Count | None = None
    batch_size: Count | None = None
    ctx_len: Count | None = None
    tokens: Count = None
    still_improving: bool = None


class End(FileModel):
    name: str = None
    mean: Amount | None = None
    sd: Amount | None = None
    seeds: Count = None
    best_step: Count = None
    last_step: Count | None = None
    final: Amount | None = None


class Effect(FileModel):  # EFFECT_KEYS
    metric: str = None
    unit: str | None = None
    flip: str = None
    direction: str = None
    against: str | None = None
    group: str = None
    n_pairs: Amount = None
    gain: float | None = None
    adj_low: float | None = None
    adj_high: float | None = None
    adj_level: Share | None = None
    family: Amount | None = None
    margin: Amount | None = Field(None, alias="threshold")  # the file's name for the margin (frames.FILE_NAMES)
    margin_basis: str | None = Field(None, alias="threshold_basis")
    call: str = None
    raw_low: float | None = None
    raw_high: float | None = None
    p_holm: Share | None = None
    mde: Amount | None = None
    noise: Amount | None = None
    df: Amount | None = None
    # a tuned study's widening of the interval for its LR selection's error, below and above (null: none; absent:
    # a file from before they were recorded, whose interval holds them: rejudge recovers them from it)
    allow_low: Amount | None = None
    allow_high: Amount | None = None
    prior_df: float | None = None  # files judged before issue 35: the moderation's d0 (0: none borrowed; null: inf)
    note: str | None = None  # speed from the training runs, not a timing pass: effects.OVERLAP_NOTE


class EvalGain(FileModel):
    flip: str = None
    direction: str = None
    group: str = None
    steps: list[Count] = None
    tokens: list[Amount | None] = None
    gain: list[float | None] = None

    @model_validator(mode="after")
    def _aligned(self) -> EvalGain:
        if len({len(v) for v in (self.steps, self.tokens, self.gain) if v is not None}) > 1:
            raise ValueError("steps, tokens and gain differ in length (one value of each per evaluation)")
        return self


class ConfigCost(FileModel):
    role: str = None
    params: Count | None = None
    active_params: Count | None = None
    state_bytes_4k: Count | None = None
    positions: Count = None


class ScaleBudget(FileModel):
    budget: str = None
    tokens_per_param: Amount = None


class ScaleSize(FileModel):  # scale.SIZE_COLUMNS
    series: str = None
    size: str = None
    non_embedding_params: Amount | None = None
    params: Amount | None = None
    steps: Amount | None = None
    tokens: Amount | None = None
    tokens_per_param: Amount | None = None
    runs: Amount | None = None
    still_improving: Amount | None = None
    overfit: Amount | None = None
    flags: str | None = None


class ScaleEffect(FileModel):  # scale.BY_SIZE_COLUMNS
    series: str = None
    flip: str = None
    direction: str = None
    against: str | None = None
    size: str = None
    non_embedding_params: Amount | None = None
    steps: Amount | None = None
    tokens: Amount | None = None
    n_pairs: Amount | None = None
    gain: float | None = None
    adj_low: float | None = None
    adj_high: float | None = None
    call: str | None = None
    flags: str | None = None


class Trend(FileModel):  # scale.TREND_COLUMNS
    series: str = None
    flip: str = None
    direction: str = None
    against: str | None = None
    sizes: Amount | None = None
    n_seeds: Amount | None = None
    slope: float | None = None
    slope_adj_low: float | None = None
    slope_adj_high: float | None = None
    adj_level: Share | None = None
    slope_low: float | None = None
    slope_high: float | None = None
    p_value: Share | None = None
    p_holm: Share | None = None
    fit_smallest: float | None = None
    fit_largest: float | None = None
    change: float | None = None
    margin: Amount | None = Field(None, alias="threshold")
    call: str = None


class Scale(FileModel):
    budget: ScaleBudget = None
    sizes: list[ScaleSize] = None
    effects: list[ScaleEffect] = None
    trends: list[Trend] = None


class WorthLaw(FileModel):  # worth.LAW_COLUMNS
    series: str = None
    direction: str = None
    against: str | None = None
    axis: str = None
    floor: Amount = None
    scale: Amount = None
    alpha: Amount = None
    unit: Amount = None
    low: Amount = None
    high: Amount = None
    rungs: Count = None
    seeds: Count = None
    fixed_floor: bool = None
    lack_of_fit_p: Share | None = None
    note: str = None


class Multiplier(FileModel):  # worth.WORTH_COLUMNS
    series: str = None
    rung: str = None
    direction: str = None
    flip: str = None
    against: str | None = None
    axis: str = None
    cost: Amount = None
    needed: Amount | None = None  # null: below the law's floor (no compute reaches it)
    multiplier: Amount | None = None
    low: Amount | None = None
    high: Amount | None = None
    raw_low: Amount | None = None
    raw_high: Amount | None = None
    adj_level: Share | None = None
    family: Count = None
    n_pairs: Count = None
    worth: float | None = None
    se: Amount | None = None
    p_value: Share | None = None
    p_holm: Share | None = None
    margin: Amount = None
    call: str = None
    extrapolated: bool = None
    wall_multiplier: Amount | None = None
    wall_low: Amount | None = None
    wall_high: Amount | None = None
    wall_call: str = None
    note: str = None


class WorthTrend(Trend):  # worth.worth_trends: scale.TREND_COLUMNS + the multipliers at the ladder's ends
    margin: Amount | None = None
    multiplier_smallest: Amount | None = None
    multiplier_largest: Amount | None = None
    extrapolated_rungs: str = None


class Worth(FileModel):  # report/ladder.py Ladder.record: the ladder's multipliers, or the note why none
    axis: str = None
    rungs: list[str] = None
    note: str = None
    margin: Annotated[float, Field(gt=1)] = None
    laws: list[WorthLaw] = None
    multipliers: list[Multiplier] = None
    trends: list[WorthTrend] = None


class TuningArm(FileModel):  # one config's selection (records.TuneArm's; name: its arm)
    name: str = None
    lr: Lr | None = None  # null: not tuned (its best at the grid's edge)
    best_loss: Amount = None
    sensitivity: Amount = None
    reason: str = None
    lrs: list[Lr] = None  # the LRs it trained, ascending


class TuningRow(FileModel):  # lr_comparison.COMPARISON_COLUMNS
    flip: str = None
    direction: str = None
    against: str | None = None
    group: str = None
    n_pairs: Amount = None
    gain: float | None = None  # null: not tuned (call lr_comparison.NOT_TUNED)
    adj_low: float | None = None
    adj_high: float | None = None
    call: str = None
    shared_n_pairs: Amount = None
    shared_gain: float | None = None
    shared_low: float | None = None
    shared_high: float | None = None
    shared_call: str = None
    confounded: bool = None
    end_arm: str | None = None
    variant_arm: str | None = None
    end_lr: Lr | None = None
    variant_lr: Lr | None = None


class Tuning(FileModel):
    grid: TuneGrid = None
    seeds: list[int] = None  # the selection seeds
    arms: list[TuningArm] = None
    comparison: list[TuningRow] = None


class AcrossTokenizers(FileModel):  # across_tokenizers.across's rows
    flip: str
    direction: str
    tokenizers: list[str]
    calls: dict[str, str]
    gains: dict[str, float | None]
    intervals: dict[str, list[float | None]] = None
    across: str  # holds, moves or open (across_tokenizers.ACROSS)


class PerByte(FileModel):
    val_tokens: Annotated[int, Field(gt=0)] = None
    val_bytes: Annotated[int, Field(gt=0)] = None


class Escape(FileModel):  # plateau.escape_record's runs
    config: str = None
    run_id: str = None
    seed: int = None
    steps: Annotated[int, Field(gt=0)] = None
    left_at: Annotated[int, Field(ge=0)] | None = None  # the step it left the unigram plateau at; null: never


class Plateau(FileModel):
    tolerance: Annotated[float, Field(gt=0)] = None
    runs: list[Escape] = None


class ResultsFile(FileModel):
    """The results file (FORMAT, VERSION): load() checks a file against it and renders the plain dict."""

    format: str = None
    version: Annotated[int, Field(ge=1)] = None
    study: str = None
    unit: str = None  # the losses' unit: "bits/byte" (absent: before it was written, see unit_of)
    runs: RunCounts = None
    seeds: list[int] = None
    budget: Budget = None
    ends: dict[str, End] = None
    effects: list[Effect] = None
    eval_gains: list[EvalGain] = None
    configs: list[ConfigCost] = None
    per_byte: PerByte = None  # the validation windows' targets and their UTF-8 bytes: bits per byte from nats
    scale: Scale = None
    decide: DecideRecord = None  # a --decide study's plan, rounds and why it stopped (report/decide.py)
    tuning: Tuning = None  # a --tune-lr study's LRs and its shared-LR comparison (report/lr_comparison.py)
    tokenizers: list[AcrossTokenizers] = None  # a study of several tokenizers: each call at each (across_tokenizers)
    plateau: Plateau = None  # the step each run left the unigram plateau at (report/plateau.py)
    worth: Worth = None  # a ladder's compute (or data) multipliers, or why it has none (report/ladder.py)


def load(path: Path) -> dict:
    """A results file as its plain dict (what the renderers read), checked first: not one, a newer
    version (refused by name before anything else, as its keys may mean something else), or a key
    of the wrong type (ResultsFile) is a ResultsError naming the file and the key."""
    shown = _shown(path)
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise ResultsError(f"cannot read results file {shown}: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = f"its format is {json.dumps(doc.get('format'))[:40]}" if isinstance(doc, dict) else "not a JSON object"
        raise ResultsError(f"{shown} is not an anatomy results file ({got}, not {json.dumps(FORMAT)})")
    version = doc.get("version", VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise ResultsError(f"{shown} is results version {version}; this anatomy reads up to {VERSION}")
    try:
        ResultsFile.model_validate(doc)
    except ValidationError as err:
        raise ResultsError(f"{shown}: {schema_problem(err)}") from None
    return doc


def _shown(path: Path) -> Path:
    """path as a message names it: relative to the working folder when inside it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except (OSError, ValueError):
        return Path(path)



def is_results(path: Path) -> bool:
    """Whether path holds a results file (its "format" is FORMAT): the only file `report --results`
    replaces (runs.refuse_replacing)."""
    return (json_object(path) or {}).get("format") == FORMAT
