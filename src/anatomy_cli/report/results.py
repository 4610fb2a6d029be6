"""A study's results as one small file, and the README's numbers rendered from it (no torch).

  write_results   the file `anatomy report RUNS_DIR --results PATH` writes (pandas only there)
  is_results      whether a file is one (the only kind of file --results replaces)
  load            a results file, checked whole against ResultsFile, as its plain dict
  render          one marked block or inline value, from a results document (plain dicts)
  update          every marked block of a text, rewritten from its study's results file
  main            python -m anatomy_cli.report.results [--check] [FILE ...]: rewrite, or list what drifted
                  (default: README.md and docs/*.md)

Marked blocks. A README names a study's file (experiments/results/<study>.json beside it) and
what to show; the text between the markers is the tool's, never typed by hand:
  <!-- results five-flips directions -->   ...table...   <!-- /results -->
  gain <!-- results five-flips gain rope add-one -->+0.445<!-- /results --> nats
Kinds: verdict, directions, ends, rule, moves, scale, parts, decide, tuning, lrs (blocks); gain FLIP DIRECTION
[STEP], interval FLIP DIRECTION, call FLIP DIRECTION, trend FLIP DIRECTION (the call across sizes), family (the
rule's level, family, looks and family-wise error: stats.rule_text, as the terminal and the report say them),
lr CONFIG (a tuned study's chosen LR of one config), shared-gain / shared-interval / shared-call FLIP DIRECTION
(a tuned study's effect at the shared LR) (inline). tuning: each effect at its configs' own LRs beside the
shared LR, flagged LR-confounded where the calls differ; lrs: each config's chosen LR and why (report/fair_lr.py).

The file (FORMAT, VERSION 1): study, runs {total, completed}, seeds, budget, ends {role: {name,
mean, sd, seeds, best_step, last_step, final}}, effects [{metric, unit, flip, direction, against,
group, n_pairs, gain, adj_low, adj_high, adj_level, family, threshold, threshold_basis, call,
raw_low, raw_high, p_holm}],
eval_gains [{flip, direction, group, steps, tokens, gain}] (val-loss gain at every evaluation);
configs [{role, params, active_params, state_bytes_4k, positions}] (what each config costs);
with sizes, scale {budget, sizes, effects, trends} (scale.Scale.record's rows); with --decide, decide
(decide.json); with --tune-lr, tuning {grid {center, points, factor, extend}, seeds (the selection seeds),
arms [{name, lr, best_loss, sensitivity, reason, lrs}] (lr null: not tuned), comparison
[fair_lr.COMPARISON_COLUMNS]} (fair_lr.tuned_frames' record and comparison). No curves, no paths.
Readers ignore keys they do not know; VERSION changes only when a key's meaning does, and a reader
refuses a newer version by name. A reader checks every key it knows (ResultsFile): a key may be absent
(files written before it existed; a block that needs it says so), but one that is present has its type,
null only where the writer writes null, no NaN, no negative count.
"""  # noqa: E501 (the docstring is docs/layout.md's text)

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from anatomy_cli.report import decide as decide_mod
from anatomy_cli.report import fair_lr, stats
from anatomy_cli.report import tuning as tuning_mod
from anatomy_cli.report.decide import DecideRecord
from anatomy_cli.spec.errors import InputError
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, REFERENCE, REMOVE_ONE, VERB, variant
from anatomy_cli.store.runs import FileModel, schema_problem

FORMAT, VERSION = "anatomy-results", 1
RESULTS_DIR = Path("experiments") / "results"
MARK = re.compile(r"<!-- results (?P<study>[\w.-]+) (?P<what>[^>]*?) -->(?P<body>.*?)<!-- /results -->", re.DOTALL)
EFFECT_KEYS = ("metric", "unit", "flip", "direction", "against", "group", "n_pairs", "gain", "adj_low", "adj_high",
               "adj_level", "family", "threshold", "threshold_basis", "call", "raw_low", "raw_high", "p_holm",
               "mde", "noise", "df", "note")
BLOCKS = ("verdict", "directions", "ends", "rule", "moves", "scale", "parts", "decide", "tuning", "lrs")
INLINE = ("gain", "interval", "call", "trend", "lr", "shared-gain", "shared-interval", "shared-call")


class ResultsError(InputError):
    """A results file or a marked block that cannot be read or rendered."""


# --------------------------------------------------------------------------- the file's schema
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


class TuningArm(FileModel):  # one config's selection (tuning.TuneArm's; name: its arm)
    name: str = None
    lr: Lr | None = None  # null: not tuned (its best at the grid's edge)
    best_loss: Amount = None
    sensitivity: Amount = None
    reason: str = None
    lrs: list[Lr] = None  # the LRs it trained, ascending


class TuningRow(FileModel):  # fair_lr.COMPARISON_COLUMNS
    flip: str = None
    direction: str = None
    against: str | None = None
    group: str = None
    n_pairs: Amount = None
    gain: float | None = None  # null: not tuned (call fair_lr.NOT_TUNED)
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
    grid: tuning_mod.TuneGrid = None
    seeds: list[int] = None  # the selection seeds
    arms: list[TuningArm] = None
    comparison: list[TuningRow] = None


class ResultsFile(FileModel):
    """The results file (FORMAT, VERSION): load() checks a file against it and renders the plain dict."""

    format: str = None
    version: Annotated[int, Field(ge=1)] = None
    study: str = None
    runs: RunCounts = None
    seeds: list[int] = None
    budget: Budget = None
    ends: dict[str, End] = None
    effects: list[Effect] = None
    eval_gains: list[EvalGain] = None
    configs: list[ConfigCost] = None
    scale: Scale = None
    decide: DecideRecord = None  # a --decide study's plan, rounds and why it stopped (report/decide.py)
    tuning: Tuning = None  # a --tune-lr study's LRs and its shared-LR comparison (report/fair_lr.py)


# --------------------------------------------------------------------------- writing (from report frames)


def build(root: Path, frames) -> dict:
    """The results document of the runs under root (frames: effects.report_frames(root))."""
    from anatomy_cli.report import effects as effects_mod
    from anatomy_cli.report import frames as frames_mod
    from anatomy_cli.report import scale, sections
    from anatomy_cli.report import verdict as vd

    runs, curves, effects = frames
    ref, top = sections.end_names(runs)
    floor = vd.noise_floor(runs)
    ends = {role: {"name": name, "mean": _num(floor[role][2]), "sd": _num(floor[role][0]), "seeds": floor[role][1],
                   **_fit(runs, role)}
            for role, name in ((REFERENCE, ref), (ALL_ON, top)) if role in floor}
    ev = effects_mod.effects_by_eval(runs, curves)
    eval_gains = [{"flip": f, "direction": d, "group": g, "steps": [int(x) for x in cell["step"]],
                   "tokens": [_num(x, 0) for x in cell["tokens"]], "gain": [_num(x, 4) for x in cell["gain"]]}
                  for (f, d, g), cell in ev.groupby(["flip", "direction", "group"], sort=False)]
    across = scale.scale_frames(runs, curves, effects)
    scaled = {} if across is None else {"scale": {k: [{c: _plain(v) for c, v in r.items()} for r in rows]
                                                  if isinstance(rows, list) else rows
                                                  for k, rows in across.record().items()}}
    record = decide_mod.read_record(Path(root))
    scaled |= {"decide": record.model_dump(mode="json")} if record is not None else {}
    tuned = fair_lr.tuned_frames(runs, effects)
    scaled |= {"tuning": _tuning_record(tuned)} if tuned is not None else {}
    return {"format": FORMAT, "version": VERSION, "study": Path(root).name,
            "runs": {"total": len(runs), "completed": int((runs["status"] == "completed").sum())},
            "seeds": sorted(int(s) for s in runs["seed"].dropna().unique()),
            "budget": {k: _num(v) if isinstance(v, float) else v for k, v in vd.budget(runs).items()},
            "ends": ends,
            "effects": [{k: _plain(r[k]) for k in EFFECT_KEYS}
                        for r in frames_mod.records(frames_mod.as_written(effects))],
            "eval_gains": eval_gains, "configs": _configs(runs), **scaled}


def _fit(runs, role: str) -> dict:
    """Where an end's runs (verdict.end_runs, as its mean and sd) reached their best val loss and
    where they ended: median best step, last step, mean val loss at the last evaluation."""
    from anatomy_cli.report.verdict import end_runs

    best = end_runs(runs, role)
    if best.empty or best["best_step"].isna().all():
        return {}
    last = json.loads(best["settings"].iloc[0]).get("train.steps")  # completed: trained to its steps
    return {"best_step": int(best["best_step"].median()), "last_step": last,
            "final": _num(best["final_val_loss"].mean())}


def _tuning_record(t: fair_lr.Tuned) -> dict:
    """A tuned study's "tuning": its grid, selection seeds, each config's choice, and the comparison's rows
    (fair_lr.comparison; LRs to six significant digits, the rest as the file's other numbers)."""
    from anatomy_cli.report import frames as frames_mod

    r = t.record
    arms = [{"name": a.arm, "lr": _sig(a.lr), "best_loss": _num(a.best_loss), "sensitivity": _num(a.sensitivity),
             "reason": a.reason, "lrs": [_sig(x) for x in a.lrs]} for a in r.arms]
    rows = [{k: _sig(v) if k in ("end_lr", "variant_lr") else _plain(v) for k, v in row.items()}
            for row in frames_mod.records(t.comparison)]
    return {"grid": r.grid.model_dump(mode="json"), "seeds": list(r.seeds), "arms": arms, "comparison": rows}


def _configs(runs) -> list[dict]:
    """What each config of the study costs, by role: parameters (total, active per token) and its
    decode state at frames.LONG_POSITIONS positions (batch 1, fp32)."""
    from anatomy_cli.report import frames as frames_mod

    keys = ("params", "active_params", "state_bytes_4k")
    rows = runs[(runs["role"] != "") & (runs["status"] == "completed")]
    return [{"role": role, "positions": frames_mod.LONG_POSITIONS,
             **{k: None if k not in sub or sub[k].isna().all() else int(sub[k].median()) for k in keys}}
            for role, sub in rows.groupby("role", sort=True)]


def is_results(path: Path) -> bool:
    """Whether path holds a results file (its "format" is FORMAT): the only file `report --results`
    replaces (runs.refuse_replacing)."""
    from anatomy_cli.store.runs import json_object

    return (json_object(path) or {}).get("format") == FORMAT


def write_results(path: Path, root: Path, frames) -> Path:
    from anatomy_cli.store.runs import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(build(root, frames), indent=1, allow_nan=False) + "\n")
    return path


def _num(x, digits: int = 6):
    return None if x is None or not math.isfinite(float(x)) else round(float(x), digits)


def _sig(x, digits: int = 6):
    """A learning rate: `digits` significant digits (2e-05 kept whole, where _num's decimals would round it)."""
    return None if x is None or not math.isfinite(float(x)) else float(f"{float(x):.{digits - 1}e}")


def _plain(v):
    return _num(v) if isinstance(v, float) else v


# --------------------------------------------------------------------------- reading and rendering


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


def render(doc: dict, what: str) -> str:
    """One marked block (a BLOCKS kind: markdown between newlines) or an inline value."""
    kind, *args = what.split()
    if kind in BLOCKS:
        return "\n" + globals()[f"_{kind}"](doc, *args) + "\n"
    if kind == "family":
        return _family(doc)
    if kind in INLINE:
        return _inline(doc, kind, *args)
    raise ResultsError(f"unknown results block {kind!r}; choose from {', '.join(BLOCKS)}, {', '.join(INLINE)}, "
                       f"family")


def _loss(doc: dict) -> list[dict]:
    return [e for e in doc["effects"] if e["metric"] == "best_val_loss"]


def _g(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:+.{digits}f}".replace("-", "−")


def _interval(e: dict, digits: int = 3) -> str:
    return "—" if e["adj_low"] is None else f"[{_g(e['adj_low'], digits)}, {_g(e['adj_high'], digits)}]"


def _end(doc: dict, role: str) -> str:
    return doc["ends"].get(role, {}).get("name", role)


def _change(doc: dict, e: dict) -> str:
    return (f"added to {_end(doc, REFERENCE)}" if e["direction"] == ADD_ONE
            else f"removed from {_end(doc, ALL_ON)}") + (f" [{e['group']}]" if e["group"] else "")


def _verdict(doc: dict) -> str:
    rows = sorted(_loss(doc), key=lambda e: -math.inf if e["gain"] is None else -e["gain"])
    lines = ["| rank | component | change | gain | interval | call |", "|---:|---|---|---:|---|---|"]
    lines += [f"| {i} | {e['flip']} | {_change(doc, e)} | {_g(e['gain'])} | {_interval(e)} | {e['call']} |"
              for i, e in enumerate(rows, 1)]
    return "\n".join(lines)


def _directions(doc: dict) -> str:
    effects = _loss(doc)
    dirs = [d for d in (ADD_ONE, REMOVE_ONE) if any(e["direction"] == d for e in effects)]
    heads = {ADD_ONE: f"added to the {_end(doc, REFERENCE)} end",
             REMOVE_ONE: f"removed from the {_end(doc, ALL_ON)} end"}
    by = {(e["flip"], e["direction"], e["group"]): e for e in effects}
    flips = list(dict.fromkeys((e["flip"], e["group"]) for e in sorted(effects, key=lambda e: -(e["gain"] or 0))))
    lines = ["| component | " + " | ".join(heads[d] for d in dirs) + " |", "|---|" + "---|" * len(dirs)]
    for flip, group in flips:
        cells = [by.get((flip, d, group)) for d in dirs]
        name = flip + (f" [{group}]" if group else "")
        lines.append(f"| {name} | " + " | ".join("" if e is None else f"{_g(e['gain'])} {_interval(e)} {e['call']}"
                                                  for e in cells) + " |")
    return "\n".join(lines)


def _ends(doc: dict) -> str:
    b, parts = doc["budget"], []
    for role in (REFERENCE, ALL_ON):
        e = doc["ends"].get(role)
        if e:
            sd = f", seed-to-seed sd {e['sd']:.3f}" if e["sd"] is not None else ""
            parts.append(f"the {e['name']} end reaches {e['mean']:.3f}{sd}{_path(e)}")
    tokens = f" ({b['tokens']:,} tokens)" if b.get("tokens") else ""
    n = len(doc["seeds"])
    return (f"Best val loss (nats/char), {f'mean over {n} seeds' if n != 1 else 'one seed'}: " + "; ".join(parts)
            + f"; budget {b.get('steps', '?'):,} steps{tokens}; {doc['runs']['completed']} of {doc['runs']['total']}"
            f" runs completed.")


def _path(e: dict) -> str:
    """' at step S' and what came after it (files written before these keys existed: '')."""
    if e.get("best_step") is None or not e.get("last_step") or e.get("final") is None:
        return ""
    from anatomy_cli.report.frames import run_flags

    best, last, median = e["best_step"], e["last_step"], "median " if e["seeds"] > 1 else ""
    improving, overfit = run_flags(best, last, last)  # a completed run's last evaluation is its last step
    if improving:
        return f" at {median}step {best:,}, still improving at its last evaluation"
    if overfit:
        return f" at {median}step {best:,}, then overfits: {e['final']:.3f} at step {last:,}"
    return f" at {median}step {best:,} ({e['final']:.3f} at step {last:,})"


def _decide(doc: dict) -> str:
    """A --decide study's rounds, each look's alpha and why it stopped (the seeds of each effect are in
    the other blocks); nothing for a study run without it."""
    record = doc.get("decide")
    return decide_mod.stop_text(DecideRecord.model_validate(record)) + "." if record else ""


def _margin(e: dict) -> tuple[float | None, str | None]:
    """An effect's margin and where it came from, read under the keys the file keeps for them
    (`threshold`, `threshold_basis`: EFFECT_KEYS, as frames.FILE_NAMES writes them)."""
    return e["threshold"], e["threshold_basis"]


def _family(doc: dict) -> str:
    """stats.rule_text with the study's numbers: its loss family's level and size, the looks its
    decide record planned (1 without one) and how many groups it judged apart."""
    from anatomy_cli.report.stats import rule_text

    tested = [e for e in _loss(doc) if e["family"]]
    if not tested:
        return "no intervals: every effect has fewer than two seeds"
    looks = len((doc.get("decide") or {}).get("looks") or [1])
    return rule_text(min(e["adj_level"] for e in tested), int(max(e["family"] for e in tested)), looks,
                     len({e["group"] for e in tested}))


def _rule(doc: dict) -> str:
    e = next((e for e in _loss(doc) if e["family"]), None)
    if e is None:
        return "No intervals: every effect has fewer than two seeds."
    margin, basis = _margin(e)
    edge = "unknown" if margin is None else f"±{margin:.3f} nats/char"
    family = _family(doc)
    family = family[:1].upper() + family[1:]
    if basis == "noise floor":  # a file written by the old rule (margin: the reference end's seed-to-seed sd)
        return (f"{family}; a call needs the interval to exclude 0 and the gain to lie beyond {edge} (the reference "
                f"end's seed-to-seed sd); negligible: the interval lies inside it.")
    basis = "given by min_effect" if basis == "min-effect" else "the default margin, fixed before the data"
    mdes = sorted(x["mde"] for x in _loss(doc) if x.get("mde") is not None and x["group"] == e["group"])
    mde = (f" An effect of {statistics.median(mdes):.3f} nats/char is called 80 % of the time (the median minimum "
           f"detectable effect)." if mdes else "")
    # prior_df: a file judged by the rule of issues 28-34 (variances moderated behind Bartlett's test; null:
    # one pooled variance); absent or 0: each effect on its own variance, the rule since issue 35
    borrowed = "prior_df" in e and e["prior_df"] != 0
    how = ("moderated t: the variances of the group borrow strength from each other (empirical Bayes, Smyth 2004; "
           "the rule before issue 35)" if borrowed else "each effect's own t: each effect is judged on its own "
           "variance and degrees of freedom, none borrows")
    return (f"{family}; {how}. A call needs the "
            f"interval to exclude 0 and the gain to lie beyond {edge} ({basis}); negligible: the interval lies inside "
            f"it; below margin: the interval excludes 0, the gain lies inside it; undecided: the rest.{mde}")


def _moves(doc: dict, *_: str) -> str:
    lines = []
    rows = [r for r in doc["eval_gains"] if r["group"] == (doc["eval_gains"][0]["group"] if doc["eval_gains"] else "")]
    for direction, word in VERB.items():
        mine = [r for r in rows if r["direction"] == direction]
        steps = sorted({s for r in mine for s in r["steps"] if s > 0})
        for step in dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]] if steps else []):
            at = sorted(((r["gain"][r["steps"].index(step)], r["flip"]) for r in mine if step in r["steps"]),
                        key=lambda t: -t[0])
            lines.append(f"- {word}, step {step}: " + " > ".join(f"{f} {_g(g)}" for g, f in at))
    return "\n".join(lines)


UNFAIR = "not a fair timing"  # in effects.OVERLAP_NOTE: the training runs' own tokens/s (files before NOT_TIMED too)


def _parts(doc: dict) -> str:
    """Each added part: its quality gain and call, its speed change and call (with a timing pass),
    its parameters (total, active) and its decode state at long context, against the reference end."""
    cost = {c["role"]: c for c in doc.get("configs", [])}
    ref = cost.get(REFERENCE, {})
    speed = {e["flip"]: e for e in doc["effects"] if e["metric"] == "tokens_per_s" and e["direction"] == ADD_ONE}
    lines = ["| part | gain in best val loss | speed (tokens/s) | params (active) | decode state at "
             f"{ref.get('positions', 4096):,} positions |", "|---|---|---|---|---|"]
    for e in sorted((e for e in _loss(doc) if e["direction"] == ADD_ONE), key=lambda e: -(e["gain"] or 0)):
        c, s = cost.get(variant(e["flip"], ADD_ONE), {}), speed.get(e["flip"])  # the add-one config's cost
        timed = s is not None and s["call"] != stats.NOT_TIMED and UNFAIR not in (s.get("note") or "")
        fast = f"{_g(s['gain'], 1)} % {_interval(s, 1)} {s['call']}" if timed else "not timed"
        size = "—" if c.get("params") is None else f"{c['params']:,} ({c['active_params']:,})"
        state = "—" if c.get("state_bytes_4k") is None else _mib(c["state_bytes_4k"], ref.get("state_bytes_4k"))
        lines.append(f"| {e['flip']} | {_g(e['gain'])} {_interval(e)} {e['call']} | {fast} | {size} | {state} |")
    if ref:
        lines.append(f"| ({_end(doc, REFERENCE)} end) | | | {ref['params']:,} ({ref['active_params']:,}) | "
                     f"{_mib(ref['state_bytes_4k'], None)} |")
    return "\n".join(lines)


def _mib(n: int, ref: int | None) -> str:
    ratio = "" if not ref else f", {n / ref:.2f}x"
    return f"{n / 2**20:.2f} MiB{ratio}"


def _scale(doc: dict) -> str:
    """Each component's gain at each size and its call across sizes (a study with sizes)."""
    if "scale" not in doc:
        raise ResultsError(f"{doc['study']}: no scale results (the study has fewer than two sizes)")
    sc = doc["scale"]
    names = list(dict.fromkeys(s["size"] for s in sc["sizes"]))
    params = {s["size"]: s["non_embedding_params"] for s in sc["sizes"]}
    cells = {(e["series"], e["flip"], e["direction"], e["size"]): e for e in sc["effects"]}
    lines = ["| component | change | " + " | ".join(f"{n} ({params[n]:,})" for n in names)
             + " | slope per 10x | call |",
             "|---|---|" + "---:|" * len(names) + "---:|---|"]
    for t in sc["trends"]:
        row = [cells.get((t["series"], t["flip"], t["direction"], n)) for n in names]
        slope = "n/a" if t["slope"] is None else _g(t["slope"]) + (
            f" [{_g(t['slope_adj_low'])}, {_g(t['slope_adj_high'])}]" if t.get("slope_adj_low") is not None else "")
        lines.append(f"| {t['flip']} | {_change(doc, t | {'group': t['series']})} | "
                     + " | ".join("" if e is None else f"{_g(e['gain'])} {_interval(e)}" for e in row)
                     + f" | {slope} | {t['call']} |")
    return "\n".join(lines)


def _tuning_of(doc: dict) -> dict:
    if not doc.get("tuning"):
        raise ResultsError(f"{doc['study']}: no tuning results (the study was not run with --tune-lr)")
    return doc["tuning"]


def _shared(r: dict) -> dict:
    """A comparison row's shared-LR effect, under the keys _interval reads."""
    return {"gain": r["shared_gain"], "adj_low": r["shared_low"], "adj_high": r["shared_high"],
            "call": r["shared_call"]}


def _tuning(doc: dict) -> str:
    """A tuned study's effects at each config's own LR beside the shared LR (fair_lr.table's columns),
    flagged where the two calls differ."""
    lines = ["| component | change | tuned gain | interval | call | shared-LR gain | shared interval | shared call | "
             "flag | LRs (end, variant) |", "|---|---|---:|---|---|---:|---|---|---|---|"]
    for r in _tuning_of(doc)["comparison"]:
        s, flag = _shared(r), fair_lr.CONFOUNDED if r["confounded"] else ""
        lrs = f"{tuning_mod.lr_text(r['end_lr'])}, {tuning_mod.lr_text(r['variant_lr'])}"
        lines.append(f"| {r['flip']} | {_change(doc, r)} | {_g(r['gain'])} | {_interval(r)} | {r['call']} | "
                     f"{_g(s['gain'])} | {_interval(s)} | {s['call']} | {flag} | {lrs} |")
    return "\n".join(lines)


def _lrs(doc: dict) -> str:
    """Each config's selection (fair_lr.arms_table's columns): its LR, best selection loss, sensitivity, why."""
    lines = ["| config | LR | selection loss | sensitivity | LRs tried | why |", "|---|---|---:|---:|---:|---|"]
    lines += [f"| {a['name']} | {tuning_mod.lr_text(a['lr'])} | {a['best_loss']:.4f} | {a['sensitivity']:.4f} | "
              f"{len(a['lrs'])} | {a['reason']} |" for a in _tuning_of(doc)["arms"]]
    return "\n".join(lines)


def _inline(doc: dict, kind: str, flip: str = "", direction: str = "", step: str = "") -> str:
    if kind == "lr":  # flip: the config's name
        arm = next((a for a in _tuning_of(doc)["arms"] if a["name"] == flip), None)
        if arm is None:
            raise ResultsError(f"{doc['study']}: no tuned config {flip!r}")
        return tuning_mod.lr_text(arm["lr"])
    if kind.startswith("shared-"):
        r = next((r for r in _tuning_of(doc)["comparison"] if r["flip"] == flip and r["direction"] == direction), None)
        if r is None:
            raise ResultsError(f"{doc['study']}: no shared-LR effect {flip} {direction}")
        s = _shared(r)
        return {"shared-gain": _g(s["gain"]), "shared-interval": _interval(s), "shared-call": s["call"]}[kind]
    if kind == "trend":
        t = next((t for t in doc.get("scale", {}).get("trends", [])
                  if t["flip"] == flip and t["direction"] == direction), None)
        if t is None:
            raise ResultsError(f"{doc['study']}: no trend across sizes for {flip} {direction}")
        return t["call"]
    if step:
        row = next((r for r in doc["eval_gains"] if r["flip"] == flip and r["direction"] == direction), None)
        if row is None or int(step) not in row["steps"]:
            raise ResultsError(f"{doc['study']}: no evaluation gain for {flip} {direction} at step {step}")
        return _g(row["gain"][row["steps"].index(int(step))])
    e = next((e for e in _loss(doc) if e["flip"] == flip and e["direction"] == direction), None)
    if e is None:
        raise ResultsError(f"{doc['study']}: no effect {flip} {direction}")
    return {"gain": _g(e["gain"]), "interval": _interval(e), "call": e["call"]}[kind]


# --------------------------------------------------------------------------- documents


def update(text: str, folder: Path) -> str:
    """text with every marked block rendered from folder/experiments/results/<study>.json."""
    cache: dict[str, dict] = {}

    def one(m: re.Match) -> str:
        study = m["study"]
        path = Path(folder) / RESULTS_DIR / f"{study}.json"
        if study not in cache:
            cache[study] = load(path)
        try:
            body = render(cache[study], m["what"])
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as err:  # a file missing a key
            raise ResultsError(f"{_shown(path)} cannot render '{m['what']}': {err.__class__.__name__}: {err}") from None
        return f"<!-- results {study} {m['what']} -->{body}<!-- /results -->"

    return MARK.sub(one, text)


def drifted(text: str, folder: Path) -> list[str]:
    """The marked blocks whose text differs from what their results file renders ('study what')."""
    fresh = update(text, folder)
    return [f"{a['study']} {a['what']}" for a, b in zip(MARK.finditer(text), MARK.finditer(fresh)) if a[0] != b[0]]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"] or [Path("README.md"), *sorted(Path("docs").glob("*.md"))]
    bad = 0
    for path in paths:  # a file missing, unreadable or rendering nothing: one line, exit 2
        try:
            text = path.read_text(encoding="utf-8")
            bad += _one_file(path, text, check)
        except (OSError, UnicodeDecodeError, ResultsError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 1 if bad else 0


def root_of(path: Path) -> Path:
    """The folder whose experiments/results/ a document's blocks read: the nearest of its own folder
    and those above it that has one (docs/x.md reads the repository's), else its own."""
    here = path.resolve().parent
    return next((d for d in (here, *here.parents) if (d / RESULTS_DIR).is_dir()), path.parent)


OPENING = re.compile(r"<!-- results [\w.-]+ [^>]*?-->")


def unclosed(text: str) -> list[int]:
    """Line numbers of opening markers that no `<!-- /results -->` closes (left silently unrendered)."""
    inside = {m.start() for m in MARK.finditer(text)}
    return [text.count("\n", 0, m.start()) + 1 for m in OPENING.finditer(text) if m.start() not in inside]


def _one_file(path: Path, text: str, check: bool) -> int:
    """--check: the number of drifted blocks (each named on stderr); else rewrite them, 0. A marker
    left open is one line naming the file and line, before anything is rewritten."""
    lines = unclosed(text)
    if lines:
        raise ResultsError(f"{path} line {lines[0]}: a results marker has no closing <!-- /results -->")
    if check:
        blocks = drifted(text, root_of(path))
        for block in blocks:
            print(f"{path}: block '{block}' differs from its results file", file=sys.stderr)
        return len(blocks)
    new = update(text, root_of(path))
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"{path}: rewritten from {RESULTS_DIR}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
