"""Read run directories into pandas frames and write the comparison report (no torch).

  load_runs          every run dir under a root -> (runs frame, long curves frame)
  component_effects  runs frame -> add-one / remove-one gain of each component, paired by seed,
                     judged as one family by stats.py's rule (adjusted interval, threshold, call)
  effects_by_eval    the same pairs at every evaluation step (effects over training)
  report_frames      runs, curves, loss and speed effects (speed from a timing pass when there is one)
  write_report       the files: report.md/.html (words: sections.py, verdict.py), CSV, JSON, figures
                     (figures.py), rendered by document.py

How an effect is measured. A run's role comes from its own config.json, never from its name, read
against the components of its study (the sweep directory's sweep.json; the five 2017 -> LLaMA
parts where there is none): the reference end ("2017") has every component off, the all-on end
("llama") every one on, an add-one run exactly one, a remove-one run all but one. Runs are
compared only inside a group that shares the study and every config value except the settings
its components switch and the seed, and only pairs with the same seed are differenced (same data
order, same init stream), as the gain of having the component (positive = it helps):
  add-one f     gain = loss(reference end)  - loss(reference + f)
  remove-one f  gain = loss(all-on end - f) - loss(all-on end)
For speed-like metrics (RELATIVE_METRICS) the gain is a relative change in percent instead
(stats.gain). Only pairs whose two runs completed count; the rest are tallied in `excluded` (a
diverged run is a result to report, not a number to average).

Library code: returns data or writes files, never prints or exits; problems raise RunError or
ValueError with a one-line message. Figures use matplotlib's object API (no pyplot global state).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from anatomy_cli import components as comp
from anatomy_cli import document, figures, scale, stats, timing
from anatomy_cli import verdict as vd
from anatomy_cli.config import ModelConfig, TrainConfig
from anatomy_cli.runs import (
    COMPLETED,
    CONFIG,
    RunError,
    atomic_write_text,
    find_runs,
    read_config,
    read_ctx_losses,
    read_design,
    read_metrics,
    read_summary,
    status_of,
)
from anatomy_cli.summary import COLUMNS, RunSummary

EVAL = "eval.json"  # optional: {"val_loss_by_ctx": {"128": 1.52, "512": null}, ...}
INCOMPLETE = "incomplete"  # status of a run dir without summary.json (never finished, or killed)
SPIKE_FACTOR = 1.5
# Metrics whose effect is a relative change in percent (their scale depends on the hardware).
RELATIVE_METRICS = ("tokens_per_s", "step_time_ms", "wall_s", "params")
HIGHER_IS_BETTER = ("tokens_per_s",)  # every other metric: lower is better
FORMATS = ("md", "html", "csv", "json")
LONG_POSITIONS = 4096  # state_bytes_4k: ModelConfig.cache_bytes, which tests pin to bench-decode's tensors
SAMPLE_CHARS = 2000  # a report shows at most this much of each samples.txt

# Summary columns (summary.COLUMNS) are RunSummary's fields marked as such, typed by it.
RUN_COLUMNS = [
    "run_id", "path", "label", "role", "size", *comp.BUILTIN_NAMES, "n_layer", "n_head", "n_kv_head", "d_model",
    "seed", "status", *COLUMNS, "non_embedding_params", "state_bytes_4k", "overfit_gap", "max_grad_norm",
    "loss_spikes", "design", "settings",
]  # + a column per spec component found in sweep.json files, one val_loss_ctx_<N> per eval.json length
INT_COLUMNS = ("n_layer", "n_head", "n_kv_head", "d_model", "seed", "loss_spikes", "non_embedding_params",
               "state_bytes_4k", *(c for c in COLUMNS if RunSummary.kind(c) is int))
FLOAT_COLUMNS = ("max_grad_norm", *(c for c in COLUMNS if RunSummary.kind(c) is float))
CURVE_COLUMNS = ["run_id", "step", "tokens", "split", "loss", "grad_norm"]  # grad_norm on train rows
EFFECT_COLUMNS = ["metric", "flip", "direction", "against", "group", "n_pairs", "excluded", "unit", "gain",
                  "adj_low", "adj_high", "threshold", "threshold_basis", "call", "raw_low", "raw_high", "sd",
                  "p_value", "p_holm", "adj_level", "family", "note"]
CTX_PREFIX = "val_loss_ctx_"


# ------------------------------------------------------------------------------- loading


def load_runs(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves): one row per run dir under root, and every logged loss in long form.

    runs has RUN_COLUMNS plus spec components' and val_loss_ctx_<N> columns; curves has run_id,
    step, split ('train' | 'val'), loss. `role` is 'reference', 'all-on', '+f', '-f' or '' within
    the run's study (`design`: its component names joined by '+'); `settings` is the JSON of every
    config value except name, seed and what the study's components switch: runs with equal design
    and settings differ only in components and seed. `size` names the run's rung of its study's
    size ladder ('' without one): the size whose settings (sweep.json) its config holds.
    """
    dirs = _run_dirs(Path(root))
    studies: dict[Path, tuple[tuple[comp.Component, ...], list[dict]]] = {}
    rows, curves = [], []
    for run_id, run_dir in zip(_run_ids(Path(root), dirs), dirs):
        if run_dir.parent not in studies:
            studies[run_dir.parent] = (_design(run_dir.parent), _sizes(run_dir.parent))
        metrics = read_metrics(run_dir)
        rows.append(_run_row(run_id, run_dir, metrics, *studies[run_dir.parent]))
        curves.extend(_curve_rows(run_id, metrics))
    return _runs_frame(rows), pd.DataFrame(curves, columns=CURVE_COLUMNS)


def _design(sweep_dir: Path) -> tuple[comp.Component, ...]:
    """The components a sweep directory's runs were planned with (the five when it has no sweep.json)."""
    design = read_design(sweep_dir)
    if design is None:
        return tuple(comp.BY_NAME[n] for n in comp.FIVE)
    try:
        return tuple(comp.from_record(r) for r in design["components"])
    except (KeyError, TypeError, AttributeError) as err:
        raise RunError(f"corrupt sweep.json in {sweep_dir}: {err!r}") from None


def _sizes(sweep_dir: Path) -> list[dict]:
    """The size ladder a sweep directory's runs were planned with: [{"name", "settings", "budget"}]."""
    sizes = (read_design(sweep_dir) or {}).get("sizes", [])
    if not isinstance(sizes, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str)
                                              and isinstance(s.get("settings"), dict) for s in sizes):
        raise RunError(f"corrupt sweep.json in {sweep_dir}: sizes is not a list of {{name, settings}}")
    return sizes


def _size_of(flat: dict, sizes: list[dict], design: tuple[comp.Component, ...]) -> str:
    """The name of the size whose settings the run's config holds ('' for none); a setting a
    component of the study switches (a size's n_kv_head under gqa) is the component's, not the size's."""
    switched = {k for c in design for k in c.keys}
    for size in sizes:
        if all(flat.get(k) == v for k, v in size["settings"].items() if k not in switched):
            return size["name"]
    return ""


def _run_dirs(root: Path) -> list[Path]:
    if not root.exists():
        raise RunError(f"runs directory not found: {root}")
    if not root.is_dir():
        raise RunError(f"not a directory: {root}")
    dirs = find_runs(root)
    if not dirs:
        raise RunError(f"no runs under {root} (no run directory with a {CONFIG})")
    return dirs


def _run_ids(root: Path, dirs: list[Path]) -> list[str]:
    """The directory name; the path below root where two runs share a name (two sweeps)."""
    names = [d.name for d in dirs]
    return [d.relative_to(root).as_posix() if names.count(d.name) > 1 else d.name for d in dirs]


def _run_row(run_id: str, run_dir: Path, metrics: list[dict], design: tuple[comp.Component, ...],
             sizes: list[dict] = ()) -> dict:
    config = read_config(run_dir)
    model = _model_config(config, run_dir)
    flat = comp.flat_config({**config, "model": model.model_dump(mode="json")})
    known = [*comp.BUILTINS, *(c for c in design if c.name not in comp.BY_NAME)]
    row = {"run_id": run_id, "path": str(run_dir), "label": comp.label(flat, known),
           "role": _role({c.name: c.state(flat) for c in design}, [c.name for c in design]),
           "size": _size_of(flat, sizes, design)}
    row |= {c.name: bool(c.state(flat)) for c in known}
    row |= {k: getattr(model, k) for k in ("n_layer", "n_head", "n_kv_head", "d_model")}
    row["non_embedding_params"] = model.non_embedding_params()
    # decode state (KV cache, windows, recurrent memory) at LONG_POSITIONS positions, batch 1, fp32
    row["state_bytes_4k"] = model.cache_bytes(1, LONG_POSITIONS, 4)
    row |= {"seed": config.get("seed"), "design": "+".join(c.name for c in design),
            "settings": _settings_key(flat, design)}
    row |= _outcome(read_summary(run_dir), metrics)
    if row["active_params"] is None and not model.moe:  # summaries from before MoE: all of a dense model is active
        row["active_params"] = row["params"]
    warmup = config.get("train", {}).get("warmup", TrainConfig.model_fields["warmup"].default)
    row |= _stability(metrics, warmup)
    row |= _ctx_losses(run_dir)
    return row


def _model_config(config: dict, run_dir: Path) -> ModelConfig:
    # Keys this version does not know are dropped, so an older report reads newer runs.
    known = {k: v for k, v in config.get("model", {}).items() if k in ModelConfig.model_fields}
    try:
        return ModelConfig.model_validate(known)
    except ValueError as err:
        first = str(err).splitlines()[-1].strip()
        raise RunError(f"invalid model config in {run_dir / CONFIG}: {first}") from None


def _settings_key(flat: dict, design: tuple[comp.Component, ...]) -> str:
    """JSON of the flattened config minus name, seed and every setting the study's components switch."""
    switched = {k for c in design for k in c.keys}
    return json.dumps({k: v for k, v in flat.items() if k not in switched and k not in ("name", "seed")},
                      sort_keys=True, default=str)


def _outcome(summary: dict | None, metrics: list[dict]) -> dict:
    """Summary fields; losses fall back to metrics.jsonl when there is no summary yet."""
    summary = summary or {}
    out = {k: summary.get(k) for k in COLUMNS}
    out["status"] = status_of(summary) or INCOMPLETE  # a killed run reads 'interrupted', not 'running'
    vals = [(m.get("step"), m["val_loss"]) for m in metrics if m.get("val_loss") is not None]
    finite = [(s, v) for s, v in vals if math.isfinite(v)]
    if finite and out["best_val_loss"] is None:
        out["best_step"], out["best_val_loss"] = min(finite, key=lambda p: p[1])
    if vals and out["final_val_loss"] is None:
        out["final_val_loss"] = vals[-1][1]
    return out


def _stability(metrics: list[dict], warmup: int) -> dict:
    steps = np.array([m.get("step", i) for i, m in enumerate(metrics)], dtype=float)
    losses = _column(metrics, "train_loss")
    grads = _column(metrics, "grad_norm")
    grads = grads[~np.isnan(grads)]
    return {"max_grad_norm": float(grads.max()) if grads.size else math.nan,
            "loss_spikes": count_loss_spikes(steps, losses, warmup)}


def _column(metrics: list[dict], key: str) -> np.ndarray:
    return np.array([math.nan if m.get(key) is None else m[key] for m in metrics], dtype=float)


def count_loss_spikes(steps: np.ndarray, losses: np.ndarray, warmup: int,
                      factor: float = SPIKE_FACTOR) -> int:
    """How many logged steps at or after warmup (step >= warmup) are loss spikes.

    A spike is a train loss above `factor` x the lowest train loss logged at any earlier step
    (warmup steps included), or a non-finite train loss (NaN/inf: the worst spike there is).
    Warmup is skipped because the loss is still falling fast and lr is still rising there.
    """
    losses = np.asarray(losses, dtype=float)
    lowest = np.fmin.accumulate(np.where(np.isnan(losses), np.inf, losses))
    before = np.concatenate([[np.inf], lowest[:-1]])  # minimum strictly before each step
    spike = ~np.isfinite(losses) | (losses > factor * before)
    return int(np.sum(spike & (np.asarray(steps) >= warmup)))


def _ctx_losses(run_dir: Path) -> dict:
    path = run_dir / EVAL
    if not path.exists():
        return {}
    return {f"{CTX_PREFIX}{n}": math.nan if v is None else v for n, v in read_ctx_losses(path).items()}


def _curve_rows(run_id: str, metrics: list[dict]) -> list[tuple]:
    rows = []
    for m in metrics:
        for split in ("train", "val"):
            if m.get(f"{split}_loss") is not None and m.get("step") is not None:
                grad = m.get("grad_norm") if split == "train" else None
                rows.append((run_id, int(m["step"]), math.nan if m.get("tokens") is None else float(m["tokens"]),
                             split, float(m[f"{split}_loss"]), math.nan if grad is None else float(grad)))
    return rows


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    custom = [c for c in df.columns if c not in RUN_COLUMNS and not c.startswith(CTX_PREFIX)]
    df[custom] = df[custom].fillna(False).astype(bool) if custom else df[custom]
    ctx = sorted((c for c in df.columns if c.startswith(CTX_PREFIX)),
                 key=lambda c: int(c.removeprefix(CTX_PREFIX)))
    for col in INT_COLUMNS:  # nullable ints: a missing params or diverged_at stays <NA>
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    for col in (*FLOAT_COLUMNS, *ctx):
        df[col] = pd.to_numeric(df[col]).astype(float)
    df["overfit_gap"] = df["final_val_loss"] - df["best_val_loss"]
    return df[RUN_COLUMNS + custom + ctx]


# ------------------------------------------------------------------------------- effects


def component_effects(runs_df: pd.DataFrame, metric: str = "best_val_loss",
                      min_effect: float | None = None) -> pd.DataFrame:
    """Add-one and remove-one effect of each flip on `metric`, paired by seed, judged (EFFECT_COLUMNS).

    `gain` is what having the component is worth (positive = it helps; gain_of), in the metric's
    units (unit 'abs') or, for RELATIVE_METRICS such as tokens_per_s, in percent (unit '%'). Every
    effect of the metric is one family for stats.judge: adj_low/adj_high the simultaneous interval
    the call is made from, raw_low/raw_high the uncorrected 95% one, p_holm Holm's p. The threshold
    is `min_effect`, else the metric's noise floor (threshold). `excluded` counts pairs skipped
    because a run did not complete (or lacks the metric).
    """
    rows = _effect_rows(runs_df, metric)
    th = (min_effect, vd.GIVEN) if min_effect is not None else (threshold(runs_df, metric), vd.FLOOR)
    return _effects_frame(rows, {metric: th})


def _effect_rows(runs_df: pd.DataFrame, metric: str) -> list[dict]:
    if metric not in runs_df.columns:
        raise ValueError(f"unknown metric {metric!r}: not a column of the runs frame")
    runs = runs_df[runs_df["role"] != ""]
    rows = []
    for group, members in _groups(runs):
        rows += _group_effects(members, group, metric)
    return rows


def _role(states: dict[str, bool | None], names: list[str]) -> str:
    """'reference' | 'all-on' | '+f' (add-one) | '-f' (remove-one); '' for any other mix or a
    component the run's config cannot place (neither its on nor its off settings)."""
    if any(v is None for v in states.values()):
        return ""
    on = [n for n in names if states[n]]
    if not on:
        return "reference"
    if len(on) == 1:  # before all-on: with one component, its add-one run is also the all-on end
        return f"+{on[0]}"
    if len(on) == len(names):
        return "all-on"
    if len(on) == len(names) - 1:
        return f"-{next(n for n in names if n not in on)}"
    return ""


def _groups(runs: pd.DataFrame):
    """(label, runs) per study and shared settings. A component whose on state is a range (gqa: any
    n_kv_head < n_head) may appear with several values in hand-made runs (a sweep refuses an
    n_kv_head axis); each value then gets its own group, sharing the runs without it."""
    keys = runs["design"] + "|" + runs["settings"]
    names = _group_names(keys, runs["size"])
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


def _ranged(design: list[str]) -> list[tuple[str, str]]:
    """(component, runs-frame column) for the design's components whose on state is a relation."""
    return [(c.name, key.removeprefix("model.")) for c in (comp.BY_NAME.get(n) for n in design) if c
            for key, v in c.on.items() if isinstance(v, comp.Follows) and v.less]


def _group_names(keys: pd.Series, sizes: pd.Series | None = None) -> dict[str, str]:
    """'n_layer=12, train.lr=0.001': only the settings (and studies) that differ between groups. When
    every group has a size, the size's name says the settings only sizes vary: 'size M, train.lr=0.001'."""
    parsed = {s: {"study": s.split("|", 1)[0], **json.loads(s.split("|", 1)[1])} for s in keys.unique()}
    fields = sorted(set().union(*parsed.values())) if parsed else []
    varying = [k for k in fields if len({json.dumps(p.get(k)) for p in parsed.values()}) > 1]
    size_of = dict(zip(keys, sizes)) if sizes is not None else {}
    if parsed and all(size_of.get(s) for s in parsed):  # keep what varies within a size, not only across
        values = {(k, size_of[s], json.dumps(p.get(k))) for s, p in parsed.items() for k in varying}
        varying = [k for k in varying if len({n for key, n, _ in values if key == k})
                   < len([1 for key, _, _ in values if key == k])]
    return {s: ", ".join(([f"size {size_of[s]}"] if size_of.get(s) else [])
                         + [f"{k.removeprefix('model.')}={p.get(k)}" for k in varying]) for s, p in parsed.items()}


def _pairings(members: pd.DataFrame):
    """(flip, direction, against, reference runs, variant runs) of one group, both indexed by seed."""
    # One run per role and seed: a config run twice (two sweeps) counts once, the first by id.
    members = members.sort_values("run_id").drop_duplicates(["role", "seed"])
    by_role = {role: sub.set_index("seed") for role, sub in members.groupby("role")}
    design = members["design"].iloc[0].split("+")
    if len(design) == 2:  # with two components, "A alone" is also "all-on minus B"
        for a, b in (design, design[::-1]):
            if f"+{a}" in by_role:
                by_role.setdefault(f"-{b}", by_role[f"+{a}"])
    ends = comp.end_names(design)
    ends = ("2017", "LLaMA") if ends == ("2017", "llama") else ends
    for flip in design:
        for direction, ref, var, end in (("add-one", "reference", f"+{flip}", ends[0]),
                                         ("remove-one", "all-on", f"-{flip}", ends[1])):
            if ref in by_role and var in by_role:
                yield flip, direction, f"{end} end", by_role[ref], by_role[var]


def _group_effects(members: pd.DataFrame, group: str, metric: str) -> list[dict]:
    rows = []
    for flip, direction, against, ref, var in _pairings(members):
        row = _paired(ref, var, metric, direction)
        if row:
            rows.append({"flip": flip, "direction": direction, "against": against, "group": group, **row})
    return rows


EVAL_EFFECT_COLUMNS = ["flip", "direction", "against", "group", "step", "tokens", "n_pairs", "gain",
                       "raw_low", "raw_high"]


def effects_by_eval(runs_df: pd.DataFrame, curves_df: pd.DataFrame) -> pd.DataFrame:
    """The paired val-loss gain of each flip at every evaluation step (EVAL_EFFECT_COLUMNS).

    Same pairs as component_effects on best_val_loss (same seed, both runs completed), but the
    gain is in val loss at one step, with the raw 95% t interval over seeds at that step (no call
    is made from it): whether an effect is a head start that fades or a lasting gain.
    """
    val = curves_df[curves_df["split"] == "val"]
    curves = {rid: sub.drop_duplicates("step").set_index("step") for rid, sub in val.groupby("run_id")}
    rows = []
    for group, members in _groups(runs_df[runs_df["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            gains = []
            for seed in ref.index.intersection(var.index).sort_values():
                r, v = ref.loc[seed], var.loc[seed]
                if r["status"] == COMPLETED and v["status"] == COMPLETED and r.run_id in curves and v.run_id in curves:
                    gains.append(gain_of(curves[r.run_id]["loss"], curves[v.run_id]["loss"], LOSS_METRIC,
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
    return stats.gain(end, variant, direction == "add-one", metric in RELATIVE_METRICS, metric in HIGHER_IS_BETTER)


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
    return {"metric": metric, "excluded": int((~ok).sum()), "unit": "%" if metric in RELATIVE_METRICS else "abs",
            "note": "", **stats.paired(gain[ok])}


SEED_GAIN_COLUMNS = ["group", "size", "flip", "direction", "against", "seed", "gain"]


def seed_gains(runs_df: pd.DataFrame, metric: str = "best_val_loss") -> pd.DataFrame:
    """Every completed pair's gain, one row per seed (SEED_GAIN_COLUMNS): the numbers each effect of
    component_effects is the mean of, with the group's size (scale.py fits trends across sizes to them)."""
    rows = []
    for group, members in _groups(runs_df[runs_df["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            seeds, gain, ok = _pair_gains(ref, var, metric, direction)
            rows += [{"group": group, "size": members["size"].iloc[0], "flip": flip, "direction": direction,
                      "against": against, "seed": int(seed), "gain": float(g)} for seed, g, k in zip(seeds, gain, ok) if k]
    return pd.DataFrame(rows, columns=SEED_GAIN_COLUMNS)


def _effects_frame(rows: list[dict], thresholds: dict[str, tuple[float, str]]) -> pd.DataFrame:
    """Rows -> EFFECT_COLUMNS: each metric's effects judged as one family (stats.judge) against its
    (threshold, basis)."""
    judged = []
    for metric in dict.fromkeys(r["metric"] for r in rows):
        value, basis = thresholds.get(metric, (math.nan, vd.FLOOR))
        judged += [r | {"threshold_basis": basis} for r in stats.judge([r for r in rows if r["metric"] == metric], value)]
    for r in judged:
        if r["call"] == stats.NOISE and (r["adj_low"] > 0 or r["adj_high"] < 0):
            r["note"] = "; ".join(filter(None, ["the interval excludes 0, but the gain is within the threshold",
                                                r["note"]]))
    df = pd.DataFrame(judged, columns=EFFECT_COLUMNS)
    order = {"flip": {f: i for i, f in enumerate(comp.BUILTIN_NAMES)}}  # built-ins in table order, then others
    df = df.sort_values(["metric", "direction", "flip", "group"], kind="stable",
                        key=lambda s: s.map(lambda f: order[s.name].get(f, len(order[s.name]))) if s.name in order else s)
    return df.reset_index(drop=True)


def threshold(runs_df: pd.DataFrame, metric: str) -> float:
    """The smallest effect that matters by default: the noise floor, the seed-to-seed sd of the
    reference end's `metric` (the all-on end's where there is no reference end), in percent of its
    mean for RELATIVE_METRICS; NaN with fewer than two seeds."""
    floor = vd.noise_floor(runs_df, metric)
    sd, _, mean = floor.get("reference") or floor.get("all-on") or (math.nan, 0, math.nan)
    return 100.0 * sd / mean if metric in RELATIVE_METRICS else sd


# ------------------------------------------------------------------------------- report files


LOSS_METRIC, SPEED_METRIC = "best_val_loss", "tokens_per_s"
OVERLAP_NOTE = "from training runs that may have shared the CPU: not a fair timing"


def report_frames(root: Path, min_effect: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs, curves, effects) of every run under root; effects hold loss and speed, told apart by `metric`,
    each metric judged as one family (stats.py's rule).

    Loss effects' threshold: `min_effect` (nats/char), else the noise floor. Speed effects come from
    root/timing.json when a timing pass wrote one (`anatomy ablate --time`; threshold: the reference
    end's round-to-round spread), else from the training runs' tokens/s, each row noted as not a fair
    timing (threshold: the reference end's seed-to-seed spread).
    """
    runs, curves = load_runs(Path(root))
    record = timing.read_timing(Path(root))
    if record is not None:
        speed, speed_th = timing.timing_effects(record), timing.threshold(record)
    else:
        speed, speed_th = _effect_rows(runs, SPEED_METRIC), threshold(runs, SPEED_METRIC)
        for row in speed:
            row["note"] = "; ".join(filter(None, [OVERLAP_NOTE, row["note"]]))
    loss_th = (min_effect, vd.GIVEN) if min_effect is not None else (threshold(runs, LOSS_METRIC), vd.FLOOR)
    effects = _effects_frame(_effect_rows(runs, LOSS_METRIC) + speed, {LOSS_METRIC: loss_th,
                                                                        SPEED_METRIC: (speed_th, vd.FLOOR)})
    return runs, curves, effects


def write_report(root: Path, out_dir: Path | None = None, formats: tuple[str, ...] = FORMATS,
                 frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None = None) -> dict[str, Path]:
    """Write the report files into out_dir (default <root>/report/); returns {file name: path}.

    Always the figures (forest.png, curves.png, effects-over-training.png; speed.png with a timing
    pass; grad-norm.png for a stability study; scale.png for a study at two sizes or more;
    expert-load.png when a run is a mixture of experts); 'csv' adds runs.csv, effects.csv (loss and
    speed, told apart by `metric`), eval-effects.csv and, with sizes, effects-by-size.csv; 'md'
    report.md, 'html' a self-contained report.html, 'json' report.json ({"root", "runs", "effects",
    "verdict", "eval_effects"}, and "scale" with sizes: scale.Scale.record; NaN -> null). `frames`,
    from report_frames(root), spares reading the runs again.
    """
    from anatomy_cli import sections

    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown report format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    runs, curves, effects = frames if frames is not None else report_frames(root)
    out = Path(out_dir) if out_dir is not None else Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    loss, speed = effects[effects["metric"] == LOSS_METRIC], effects[effects["metric"] == SPEED_METRIC]
    verdict, speed_verdict = vd.verdict_frame(loss), vd.verdict_frame(speed)
    eval_effects = effects_by_eval(runs, curves)
    panels = _curve_panels(runs)
    paths = {"forest.png": figures.plot_forest(verdict, out / "forest.png"),
             "curves.png": figures.plot_curves(curves, panels, out / "curves.png"),
             "effects-over-training.png": figures.plot_eval_effects(eval_effects, out / "effects-over-training.png")}
    if timing.read_timing(Path(root)) is not None:
        paths["speed.png"] = figures.plot_forest(speed_verdict, out / "speed.png", unit="%")
    if _stability_study(Path(root), runs):
        paths["grad-norm.png"] = figures.plot_curves(curves, panels, out / "grad-norm.png", value="grad_norm")
    across = scale.scale_frames(runs, curves, effects)
    if across is not None:
        paths["scale.png"] = figures.plot_scale(across.by_size, across.trends, out / "scale.png")
    loads = expert_loads(runs)
    if loads:
        paths["expert-load.png"] = figures.plot_expert_load(loads, out / "expert-load.png")
    texts = {}
    if "csv" in formats:
        texts |= {"runs.csv": runs.to_csv(index=False), "effects.csv": effects.to_csv(index=False),
                  "eval-effects.csv": eval_effects.to_csv(index=False)}
        if across is not None:
            texts["effects-by-size.csv"] = scale.by_size_csv(across).to_csv(index=False)
    if "json" in formats:
        doc = {"root": str(root), "runs": records(runs), "effects": records(effects), "verdict": records(verdict),
               "eval_effects": records(eval_effects), **({"scale": across.record()} if across is not None else {})}
        texts["report.json"] = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    if "md" in formats or "html" in formats:
        parts = sections.Parts(Path(root), runs, effects, verdict, speed_verdict, eval_effects, paths,
                               components_of(runs), across)
        lead, body = sections.lead(parts), sections.sections(parts)
        if "md" in formats:
            texts["report.md"] = document.markdown("anatomy report", lead, body)
        if "html" in formats:
            texts["report.html"] = document.html_page("anatomy report", lead, body)
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        paths[name] = out / name
    return paths


def components_of(runs: pd.DataFrame) -> dict[str, comp.Component]:
    """The components of every study under the runs, by name (about, source: the report names them)."""
    out: dict[str, comp.Component] = {}
    for sweep_dir in dict.fromkeys(Path(p).parent for p in runs["path"]):
        out |= {c.name: c for c in _design(sweep_dir) if c.name not in out}
    return out


def _curve_panels(runs: pd.DataFrame) -> list[dict]:
    """One small-multiple panel per component and direction (and group): its runs and its end's."""
    panels = []
    for group, members in _groups(runs[runs["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            sign = "+" if direction == "add-one" else "−"
            panels.append({"flip": flip, "direction": direction, "ref_name": against, "var_name": f"{sign}{flip}",
                           "title": f"{sign}{flip} vs {against}" + (f" [{group}]" if group else ""),
                           "ref": list(ref["run_id"]), "var": list(var["run_id"])})
    return panels


def expert_loads(runs: pd.DataFrame) -> list[tuple[str, list[list[float]]]]:
    """(title, [layer][expert] shares) of each mixture-of-experts config's lowest seed with a recorded load."""
    from anatomy_cli.sections import by_components

    out = []
    for run in by_components(runs).drop_duplicates(["label", "settings"]).itertuples():
        load = (read_summary(Path(run.path)) or {}).get("expert_load")
        if load:
            out.append((f"{run.label} · seed {run.seed}", load))
    return out


def _stability_study(root: Path, runs: pd.DataFrame) -> bool:
    """Show gradient norms where stability is the question: a diverged run, loss spikes, or the name says so."""
    return bool((runs["status"] == "diverged").any() or (runs["loss_spikes"].fillna(0) > 0).any()
                or "stability" in root.name)


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as plain JSON-able dicts (NaN, inf and <NA> -> None)."""
    return [{k: _json_value(v) for k, v in row.items()} for row in df.astype(object).to_dict("records")]


def _json_value(value: Any) -> Any:
    """Plain JSON scalars: NaN, inf and <NA> become None (JSON has no NaN)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return None if pd.isna(value) else value
