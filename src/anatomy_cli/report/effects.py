"""Runs frame -> effects: each component's gain, paired by seed within a group, judged by stats.py's rule (no torch).

  component_effects  runs frame -> add-one / remove-one gain of each component, paired by seed,
                     judged as one family by stats.py's rule (adjusted interval, margin, call)
  effects_by_eval    the same pairs at every evaluation step (effects over training)
  seed_gains         each seed's gain per flip (the scale trends' input)
  study_effects      a study's loss and speed effects, judged by its Rules (report.build calls it)

How an effect is measured. Runs are compared only inside a group that shares the study and every
config value except the settings its components switch and the seed, and only pairs with the same
seed are differenced (same data order, same init stream), as the gain of having the component
(positive = it helps):
  add-one f     gain = loss(reference end)  - loss(reference + f)
  remove-one f  gain = loss(all-on end - f) - loss(all-on end)
For speed-like metrics (frames.RELATIVE_METRICS) the gain is a relative change in percent instead
(stats.gain). Only pairs whose two runs completed count; the rest are tallied in `excluded` (a
diverged run is a result to report, not a number to average).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from anatomy_cli.report import lr_allowance, stats
from anatomy_cli.report import plateau as plateau_mod
from anatomy_cli.report import speed as speed_mod
from anatomy_cli.report import verdict as vd
from anatomy_cli.report.frames import HIGHER_IS_BETTER, LOSS_METRIC, RELATIVE_METRICS, SPEED_METRIC
from anatomy_cli.report.rules import Rules
from anatomy_cli.spec import components as comp
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, DIRECTIONS, END_OF, REFERENCE, REMOVE_ONE, VERB, shown, variant
from anatomy_cli.store.records import TuneRecord
from anatomy_cli.store.runs import COMPLETED, SWEEP

EFFECT_COLUMNS = ["metric", "flip", "direction", "against", "group", "n_pairs", "excluded", "unit", "gain",
                  "adj_low", "adj_high", "margin", "margin_basis", "call", "mde", "noise", "raw_low",
                  "raw_high", "sd", "se", "df", "p_value", "p_holm", "adj_level", "family", "allow_low", "allow_high",
                  "note", "plateau"]  # allow_*: a tuned study's interval widening for its LR selection's error (NaN:
# none); plateau: the runs of its pairs that left the unigram plateau late (report/plateau.py)


# ------------------------------------------------------------------------------- effects


def component_effects(runs_df: pd.DataFrame, metric: str = LOSS_METRIC, margin: float | None = None,
                      alpha: float = stats.ALPHA, tune: TuneRecord | None = None) -> pd.DataFrame:
    """Add-one and remove-one effect of each flip on `metric`, paired by seed, judged (EFFECT_COLUMNS).

    `gain` is what having the component is worth (positive = it helps; gain_of), in the metric's
    units (unit 'abs') or, for RELATIVE_METRICS such as tokens_per_s, in percent (unit '%'). The
    effects of one group are one family for stats.judge: adj_low/adj_high the simultaneous interval
    the call is made from, raw_low/raw_high the uncorrected 95% one, p_holm Holm's p. The margin
    (column `margin`) is `margin`, else the metric's default (see margin_of); `noise` is the group's
    reference-end seed sd, shown beside it. `excluded` counts pairs skipped because a run did not
    complete (or lacks the metric). alpha: each family's (a --decide study splits it over its looks).
    tune: a tuned study's record, whose LR selection's error widens its tuned runs' intervals.
    """
    return effects_frame(paired_rows(runs_df, metric, tune), {metric: margin_of(metric, margin)}, alpha)


def paired_rows(runs_df: pd.DataFrame, metric: str, tune: TuneRecord | None = None) -> list[dict]:
    """Each effect's paired statistics before judging (gain, sd, raw interval, the group's noise), one row
    per flip, direction and group: what effects_frame judges, and what the calibration harness shifts.
    tune: a tuned study's record (its runs at the frozen LRs get the selection's allowance)."""
    if metric not in runs_df.columns:
        raise ValueError(f"unknown metric {metric!r}: not a column of the runs frame")
    runs = runs_df[runs_df["role"] != ""]
    rows = []
    for group, members in groups(runs):
        noise = group_noise(members, metric)
        rows += [r | {"noise": noise} for r in _group_effects(members, group, metric, tune)]
    return rows


def groups(runs: pd.DataFrame):
    """(label, runs) per study and shared settings. A component whose on state is a range (gqa: any
    n_kv_head < n_head) may appear with several values in hand-made runs (a sweep refuses an
    n_kv_head axis); each value then gets its own group, sharing the runs without it. Runs of several study
    folders (a report of their parent) are grouped by folder too: each study is judged as itself, its seeds
    never paired with another study's ('study=demo-tuned' in the label)."""
    keys = runs["design"] + "|" + _with_study(runs)
    names = comp.group_names(keys, runs["size"])
    for key, members in runs.groupby(keys, sort=True):
        split = [(c, col) for c, col in _ranged(key.split("|")[0].split("+")) if col in members.columns]
        values = sorted(members.loc[members[split[0][0]], split[0][1]].unique()) if split else []
        if len(values) <= 1:
            yield names[key], members
            continue
        name, col = split[0]
        for value in values:
            keep = ~members[name] | (members[col] == value)
            yield ", ".join(filter(None, [names[key], f"{col}={value}"])), members[keep]


def _with_study(runs: pd.DataFrame) -> pd.Series:
    """The runs' settings keys, each with its study folder's name as a setting where the runs come from several
    study folders (each with its sweep.json; the folder's path where two share a name); as they are otherwise,
    and for runs outside a study (hand-made runs of `anatomy train` pair across their folders as before)."""
    if "path" not in runs or runs.empty:
        return runs["settings"]
    parents = {f: (f / SWEEP).is_file() for f in {Path(p).parent for p in runs["path"]}}
    studies = sorted(f for f, recorded in parents.items() if recorded)
    if len(studies) <= 1:
        return runs["settings"]
    names = [f.name for f in studies]
    shown = {f: (f.name if len(set(names)) == len(names) else str(f)) for f in studies}
    folders = runs["path"].map(lambda p: shown.get(Path(p).parent))
    return pd.Series([json.dumps({**json.loads(s), "study": name}, sort_keys=True, default=str) if name else s
                      for s, name in zip(runs["settings"], folders)], index=runs.index)


def _ranged(design: list[str]) -> list[tuple[str, str]]:
    """(component, runs-frame column) for the design's components whose on state is a relation."""
    return [(c.name, key.removeprefix("model.")) for c in (comp.BY_NAME.get(n) for n in design) if c
            for key, v in c.on.items() if isinstance(v, comp.Follows) and v.less]


def _pairings(members: pd.DataFrame):
    """(flip, direction, against, reference runs, variant runs) of one group, both indexed by seed; a
    variant that builds the same model as its end (frames' `built`) is left out: a model compared with
    itself measures nothing, so it gets no effect and no call (same_model_lines says which)."""
    for pairing in _all_pairings(members):
        if not _same_model(*pairing[3:]):
            yield pairing


def _same_model(ref: pd.DataFrame, var: pd.DataFrame) -> bool:
    seeds = ref.index.intersection(var.index)
    if seeds.empty or "built" not in ref.columns:
        return False
    return bool((ref.loc[seeds, "built"] == var.loc[seeds, "built"]).all())


def same_model_lines(runs: pd.DataFrame) -> list[str]:
    """'swa removed from the all-on end: the same model as the end, not measured', one per such variant."""
    lines = []
    for group, members in groups(runs[runs["role"] != ""]):
        for flip, direction, against, ref, var in _all_pairings(members):
            if _same_model(ref, var):
                where = f" [{group}]" if group else ""
                towards = "to" if direction == ADD_ONE else "from"
                lines.append(f"{flip} {VERB[direction]} {towards} the {against}{where}: builds the same model as the "
                             f"end (a setting it changes does nothing there), so it is not measured and gets no call")
    return lines


def _all_pairings(members: pd.DataFrame):
    # One run per role and seed: a config run twice (two sweeps) counts once, the first by id.
    members = members.sort_values("run_id").drop_duplicates(["role", "seed"])
    by_role = {role: sub.set_index("seed") for role, sub in members.groupby("role")}
    design = members["design"].iloc[0].split("+")
    if len(design) == 2:  # with two components, "A alone" is also "all-on minus B"
        for a, b in (design, design[::-1]):
            if variant(a, ADD_ONE) in by_role:
                by_role.setdefault(variant(b, REMOVE_ONE), by_role[variant(a, ADD_ONE)])
    ends = comp.end_names(design)
    ends = tuple(map(shown, ends))
    for flip in design:
        for direction, end in zip(DIRECTIONS, ends):
            ref, var = END_OF[direction], variant(flip, direction)
            if ref in by_role and var in by_role:
                yield flip, direction, f"{end} end", by_role[ref], by_role[var]


def _group_effects(members: pd.DataFrame, group: str, metric: str, tune: TuneRecord | None = None) -> list[dict]:
    tuned = tune if metric == LOSS_METRIC and lr_allowance.is_tuned(members) else None  # its LRs' error
    found = []  # (row, the end's runs, the variant's runs)
    for flip, direction, against, ref, var in _pairings(members):
        row = _paired(ref, var, metric, direction)
        if row:
            found.append(({"flip": flip, "direction": direction, "against": against, "group": group, **row}, ref, var))
    if tuned is not None:  # each effect's allowance, its noise floored at the group's median sd
        floor = lr_allowance.family_sd(row["sd"] for row, _, _ in found)
        scale = float(members["bpb_per_nat"].median()) if "bpb_per_nat" in members else 1.0  # one corpus a group
        for row, ref, var in found:
            row |= lr_allowance.allowance(tuned, lr_allowance.arm_of(ref), lr_allowance.arm_of(var),
                                          row["direction"] == ADD_ONE, row["sd"], floor, scale)
            if math.isfinite(row["allow_low"]) and math.isfinite(row["allow_high"]):
                row["note"] = "; ".join(filter(None, [row["note"], allowance_note(row)]))
    return [row for row, _, _ in found]


def allowance_note(row: dict) -> str:
    """The note of a tuned effect: its interval's widening for the LR selection's error."""
    return (f"interval widened by the LR selection's error: {row['allow_low']:.3f} below, {row['allow_high']:.3f} "
            "above (each config's regret bound)")


EVAL_EFFECT_COLUMNS = ["flip", "direction", "against", "group", "step", "tokens", "n_pairs", "gain",
                       "raw_low", "raw_high"]


def effects_by_eval(runs_df: pd.DataFrame, curves_df: pd.DataFrame) -> pd.DataFrame:
    """The paired val-loss gain (bits per byte) of each flip at every evaluation step (EVAL_EFFECT_COLUMNS).

    Same pairs as component_effects on best_val_loss (same seed, both runs completed), but the
    gain is in val loss at one step, with the raw 95% t interval over seeds at that step (no call
    is made from it): whether an effect is a head start that fades or a lasting gain.
    """
    val = curves_df[curves_df["split"] == "val"]
    curves = {rid: sub.drop_duplicates("step").set_index("step") for rid, sub in val.groupby("run_id")}
    rows = []
    for group, members in groups(runs_df[runs_df["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            gains = []
            for seed in ref.index.intersection(var.index).sort_values():
                r, v = ref.loc[seed], var.loc[seed]
                if r["status"] == COMPLETED and v["status"] == COMPLETED and r.run_id in curves and v.run_id in curves:
                    gains.append(gain_of(curves[r.run_id]["bpb"], curves[v.run_id]["bpb"], LOSS_METRIC,
                                         direction).dropna().rename(seed))
            if not gains:
                continue
            table = pd.concat(gains, axis=1)
            tokens = curves[ref.iloc[0].run_id]["tokens"] if ref.iloc[0].run_id in curves else None
            for step, values in table.iterrows():
                values = values.to_numpy(float)
                st = stats.paired(values[np.isfinite(values)])
                rows.append({"flip": flip, "direction": direction, "against": against, "group": group,
                             "step": int(step), "tokens": float(tokens.get(step, math.nan)) if tokens is not None
                             else math.nan, **{k: st[k] for k in ("n_pairs", "gain", "raw_low", "raw_high")}})
    return pd.DataFrame(rows, columns=EVAL_EFFECT_COLUMNS)


def gain_of(end, variant, metric: str, direction: str):
    """stats.gain for `metric` (relative for RELATIVE_METRICS, higher is better for tokens/s)."""
    return stats.gain(end, variant, direction == ADD_ONE, metric in RELATIVE_METRICS, metric in HIGHER_IS_BETTER)


def _pair_gains(ref: pd.DataFrame, var: pd.DataFrame, metric: str, direction: str):
    """(the seeds both have, the gain at each, whether both runs completed with a finite gain)."""
    seeds = ref.index.intersection(var.index).sort_values()
    ref, var = ref.loc[seeds], var.loc[seeds]
    done = ((ref["status"] == COMPLETED) & (var["status"] == COMPLETED)).to_numpy()
    r = ref[metric].to_numpy(dtype=float, na_value=np.nan)
    v = var[metric].to_numpy(dtype=float, na_value=np.nan)
    gain = gain_of(r, v, metric, direction)
    return seeds, gain, done & np.isfinite(gain)


def _paired(ref: pd.DataFrame, var: pd.DataFrame, metric: str, direction: str) -> dict | None:
    seeds, gain, ok = _pair_gains(ref, var, metric, direction)
    if seeds.empty:
        return None
    counted = seeds[ok]  # a loss effect notes the runs of its pairs left on the unigram plateau (plateau.py)
    loss = metric not in RELATIVE_METRICS
    note = plateau_mod.plateau_note(ref.loc[counted], var.loc[counted]) if loss else ""
    stuck = ", ".join(plateau_mod.plateau_ids(ref.loc[counted], var.loc[counted])) if loss else ""
    return {"metric": metric, "excluded": int((~ok).sum()), "unit": "abs" if loss else "%",
            "note": note, "plateau": stuck, **stats.paired(gain[ok])}


SEED_GAIN_COLUMNS = ["group", "size", "flip", "direction", "against", "seed", "gain"]


def seed_gains(runs_df: pd.DataFrame, metric: str = LOSS_METRIC) -> pd.DataFrame:
    """Every completed pair's gain, one row per seed (SEED_GAIN_COLUMNS): the numbers each effect of
    component_effects is the mean of, with the group's size (scale.py fits trends across sizes to them)."""
    rows = []
    for group, members in groups(runs_df[runs_df["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            seeds, gain, ok = _pair_gains(ref, var, metric, direction)
            rows += [{"group": group, "size": members["size"].iloc[0], "flip": flip, "direction": direction,
                      "against": against, "seed": int(seed), "gain": float(g)}
                     for seed, g, k in zip(seeds, gain, ok) if k]
    return pd.DataFrame(rows, columns=SEED_GAIN_COLUMNS)


def effects_frame(rows: list[dict], margins: dict[str, tuple[float, str]], alpha: float = stats.ALPHA) -> pd.DataFrame:
    """Rows -> EFFECT_COLUMNS: the effects of each metric and group judged as one family (stats.judge:
    one question each, at family-wise `alpha`) against the metric's (margin, basis). `alpha` is the loss
    families': a --decide study splits it over its looks; speed is timed once, so its families keep stats.ALPHA."""
    judged = []
    for metric, group in dict.fromkeys((r["metric"], r["group"]) for r in rows):
        value, basis = margins.get(metric, margin_of(metric))
        judged += [r | {"margin_basis": basis}
                   for r in stats.judge([r for r in rows if r["metric"] == metric and r["group"] == group], value,
                                        alpha if metric == LOSS_METRIC else stats.ALPHA)]
    df = pd.DataFrame(judged, columns=EFFECT_COLUMNS)
    df["plateau"] = pd.Series([v if isinstance(v, str) else "" for v in df["plateau"]], index=df.index,
                              dtype=object)  # the flagged runs a call rests on ('': none; speed rows have none)
    order = {"flip": {f: i for i, f in enumerate(comp.BUILTIN_NAMES)}}  # built-ins in table order, then others
    df = df.sort_values(["metric", "direction", "flip", "group"], kind="stable",
                        key=lambda s: s.map(lambda f: order[s.name].get(f, len(order[s.name])))
                        if s.name in order else s)
    return df.reset_index(drop=True)


def margin_of(metric: str, margin: float | None = None) -> tuple[float, str]:
    """(the smallest effect that matters, where it came from): `margin` (bits per byte, for the loss)
    when given, else the metric's default, fixed before any data (stats.DEFAULT_MARGIN, SPEED_MARGIN)."""
    if metric in RELATIVE_METRICS:
        return stats.SPEED_MARGIN, stats.DEFAULT
    return (margin, stats.GIVEN) if margin is not None else (stats.DEFAULT_MARGIN, stats.DEFAULT)


def group_noise(members: pd.DataFrame, metric: str) -> float:
    """The seed-to-seed sd of a group's reference end's `metric` (the all-on end's where it has no
    reference end), in percent of its mean for RELATIVE_METRICS; NaN with fewer than two seeds. Shown
    beside the margin, never used as it."""
    floor = vd.noise_floor(members, metric)
    sd, _, mean = floor.get(REFERENCE) or floor.get(ALL_ON) or (math.nan, 0, math.nan)
    return 100.0 * sd / mean if metric in RELATIVE_METRICS else sd
OVERLAP_NOTE = "from training runs that may have shared the CPU: not a fair timing"
UNTIMED_NOTE = f"{OVERLAP_NOTE}, so no call (only a timing pass calls speed: anatomy ablate --time)"


def study_effects(runs: pd.DataFrame, rules: Rules, timing: dict | None) -> pd.DataFrame:
    """The loss and speed effects of a study's runs, told apart by `metric`, each metric judged as one family
    per group (stats.py's rule) by the study's Rules: the loss at its margin and its looks' alpha (a tuned
    study's runs at the frozen LRs widened by the selection's error), speed at stats.SPEED_MARGIN.

    Speed effects come from the timing pass's record when there is one (`anatomy ablate --time`; noise: the
    reference end's round-to-round spread; `timing`: the study's record, or the report root's), else from the
    training runs' tokens/s, each row noted as not a fair timing (noise: the reference end's seed-to-seed
    spread). Only a timing pass's are called: the training runs' keep gain and interval, with the call
    stats.NOT_TIMED and UNTIMED_NOTE."""
    if timing is not None:
        spread = speed_mod.noise(timing)
        speed = [r | {"noise": spread} for r in speed_mod.timing_effects(timing)]
    else:
        speed = paired_rows(runs, SPEED_METRIC)
        for row in speed:
            row["note"] = "; ".join(filter(None, [UNTIMED_NOTE, row["note"]]))
    loss = paired_rows(runs, LOSS_METRIC, rules.tune)
    effects = effects_frame(loss + speed, {LOSS_METRIC: (rules.margin, rules.margin_basis)}, rules.alpha)
    untimed = (effects["metric"] == SPEED_METRIC) & effects["note"].fillna("").str.startswith(UNTIMED_NOTE)
    effects.loc[untimed, "call"] = stats.NOT_TIMED  # the CPU was shared: no call on speed from training runs
    return effects
