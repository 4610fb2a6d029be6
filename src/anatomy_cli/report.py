"""Read run directories into pandas frames and write the comparison report (no torch).

  load_runs          every run dir under a root -> (runs frame, long curves frame)
  component_effects  runs frame -> add-one / remove-one effect of each component, paired by seed,
                     Holm-corrected over every effect of the metric (stats.py)
  effects_by_eval    the same pairs at every evaluation step (effects over training)
  report_frames      runs, curves, loss and speed effects (speed from a timing pass when there is one)
  write_report       the files: report.md/.html (verdict first: verdict.py), CSV, JSON, figures
                     (figures.py), rendered by document.py

How an effect is measured. A run's role comes from its own config.json, never from its name, read
against the components of its study (the sweep directory's sweep.json; the five 2017 -> LLaMA
parts where there is none): the reference end ("2017") has every component off, the all-on end
("llama") every one on, an add-one run exactly one, a remove-one run all but one. Runs are
compared only inside a group that shares the study and every config value except the settings
its components switch and the seed, and only pairs with the same seed are differenced (same data
order, same init stream):
  add-one f     delta = metric(reference + f)   - metric(reference end)
  remove-one f  delta = metric(all-on end - f)  - metric(all-on end)
For speed-like metrics (RELATIVE_METRICS) the delta is a relative change in percent instead:
100 * (variant / reference - 1). Only pairs whose two runs completed count; the rest are tallied
in `excluded` (a diverged run is a result to report, not a number to average).

Library code: returns data or writes files, never prints or exits; problems raise RunError or
ValueError with a one-line message. Figures use matplotlib's object API (no pyplot global state).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from anatomy_cli import components as comp
from anatomy_cli import document, figures, stats, timing
from anatomy_cli import verdict as vd
from anatomy_cli.config import ModelConfig, TrainConfig
from anatomy_cli.runs import (
    COMPLETED,
    CONFIG,
    SAMPLES,
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
from anatomy_cli.stats import t_interval

EVAL = "eval.json"  # optional: {"val_loss_by_ctx": {"128": 1.52, "512": null}, ...}
INCOMPLETE = "incomplete"  # status of a run dir without summary.json (never finished, or killed)
SPIKE_FACTOR = 1.5
# Metrics whose effect is a relative change in percent (their scale depends on the hardware).
RELATIVE_METRICS = ("tokens_per_s", "step_time_ms", "wall_s", "params")
FORMATS = ("md", "html", "csv", "json")
SAMPLE_CHARS = 2000  # a report shows at most this much of each samples.txt

RUN_COLUMNS = [
    "run_id", "path", "label", "role", *comp.BUILTIN_NAMES, "n_layer", "n_head", "n_kv_head", "d_model", "seed",
    "params", "active_params", "status", "best_val_loss", "best_step", "final_val_loss", "overfit_gap",
    "bits_per_char", "tokens_per_s", "step_time_ms", "wall_s", "diverged_at", "max_grad_norm",
    "loss_spikes", "design", "settings",
]  # + a column per spec component found in sweep.json files, one val_loss_ctx_<N> per eval.json length
INT_COLUMNS = ("n_layer", "n_head", "n_kv_head", "d_model", "seed", "params", "active_params", "best_step",
               "diverged_at", "loss_spikes")
FLOAT_COLUMNS = ("best_val_loss", "final_val_loss", "bits_per_char", "tokens_per_s",
                 "step_time_ms", "wall_s", "max_grad_norm")
SUMMARY_KEYS = ("params", "active_params", "best_val_loss", "best_step", "final_val_loss", "bits_per_char",
                "tokens_per_s", "step_time_ms", "wall_s", "diverged_at")
CURVE_COLUMNS = ["run_id", "step", "tokens", "split", "loss", "grad_norm"]  # grad_norm on train rows
EFFECT_COLUMNS = ["metric", "flip", "direction", "against", "group", "n_pairs", "excluded", "mean_delta",
                  "ci_low", "ci_high", "unit", "p_value", "p_holm", "within_noise", "note"]
CTX_PREFIX = "val_loss_ctx_"


# ------------------------------------------------------------------------------- loading


def load_runs(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves): one row per run dir under root, and every logged loss in long form.

    runs has RUN_COLUMNS plus spec components' and val_loss_ctx_<N> columns; curves has run_id,
    step, split ('train' | 'val'), loss. `role` is 'reference', 'all-on', '+f', '-f' or '' within
    the run's study (`design`: its component names joined by '+'); `settings` is the JSON of every
    config value except name, seed and what the study's components switch: runs with equal design
    and settings differ only in components and seed.
    """
    dirs = _run_dirs(Path(root))
    designs: dict[Path, tuple[comp.Component, ...]] = {}
    rows, curves = [], []
    for run_id, run_dir in zip(_run_ids(Path(root), dirs), dirs):
        if run_dir.parent not in designs:
            designs[run_dir.parent] = _design(run_dir.parent)
        metrics = read_metrics(run_dir)
        rows.append(_run_row(run_id, run_dir, metrics, designs[run_dir.parent]))
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


def _run_dirs(root: Path) -> list[Path]:
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


def _run_row(run_id: str, run_dir: Path, metrics: list[dict], design: tuple[comp.Component, ...]) -> dict:
    config = read_config(run_dir)
    model = _model_config(config, run_dir)
    flat = comp.flat_config({**config, "model": model.model_dump(mode="json")})
    known = [*comp.BUILTINS, *(c for c in design if c.name not in comp.BY_NAME)]
    row = {"run_id": run_id, "path": str(run_dir), "label": comp.label(flat, known),
           "role": _role({c.name: c.state(flat) for c in design}, [c.name for c in design])}
    row |= {c.name: bool(c.state(flat)) for c in known}
    row |= {k: getattr(model, k) for k in ("n_layer", "n_head", "n_kv_head", "d_model")}
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
    out = {k: summary.get(k) for k in SUMMARY_KEYS}
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


def component_effects(runs_df: pd.DataFrame, metric: str = "best_val_loss") -> pd.DataFrame:
    """Add-one and remove-one effect of each flip on `metric`, paired by seed (EFFECT_COLUMNS).

    mean_delta/ci_low/ci_high are in the metric's units (unit 'abs'), or, for RELATIVE_METRICS
    such as tokens_per_s, a relative change in percent (unit '%'). The CI is a 95% Student-t
    interval over the paired differences (uncorrected); p_value is the paired t-test's, p_holm
    the Holm-Bonferroni adjusted one over every effect of this call; within_noise is True when
    p_holm >= 0.05 (the corrected call: m effects are tested at once) and None with
    fewer than two pairs. `excluded` counts pairs skipped because a run did not complete (or
    lacks the metric).
    """
    return _effects_frame(_effect_rows(runs_df, metric))


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
    names = _group_names(keys)
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


def _group_names(keys: pd.Series) -> dict[str, str]:
    """'n_layer=12, train.lr=0.001': only the settings (and studies) that differ between groups."""
    parsed = {s: {"study": s.split("|", 1)[0], **json.loads(s.split("|", 1)[1])} for s in keys.unique()}
    fields = sorted(set().union(*parsed.values())) if parsed else []
    varying = [k for k in fields if len({json.dumps(p.get(k)) for p in parsed.values()}) > 1]
    return {s: ", ".join(f"{k.removeprefix('model.')}={p.get(k)}" for k in varying)
            for s, p in parsed.items()}


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
        row = _paired(ref, var, metric)
        if row:
            rows.append({"flip": flip, "direction": direction, "against": against, "group": group, **row})
    return rows


EVAL_EFFECT_COLUMNS = ["flip", "direction", "against", "group", "step", "tokens", "n_pairs", "mean_delta",
                       "ci_low", "ci_high"]


def effects_by_eval(runs_df: pd.DataFrame, curves_df: pd.DataFrame) -> pd.DataFrame:
    """The paired val-loss effect of each flip at every evaluation step (EVAL_EFFECT_COLUMNS).

    Same pairs as component_effects on best_val_loss (same seed, both runs completed), but the
    delta is val loss(variant) - val loss(reference) at one step, with a 95% t interval over
    seeds at that step: whether an effect is a head start that fades or a lasting gain.
    """
    val = curves_df[curves_df["split"] == "val"]
    curves = {rid: sub.drop_duplicates("step").set_index("step") for rid, sub in val.groupby("run_id")}
    rows = []
    for group, members in _groups(runs_df[runs_df["role"] != ""]):
        for flip, direction, against, ref, var in _pairings(members):
            deltas = []
            for seed in ref.index.intersection(var.index).sort_values():
                r, v = ref.loc[seed], var.loc[seed]
                if r["status"] == COMPLETED and v["status"] == COMPLETED and r.run_id in curves and v.run_id in curves:
                    a, b = curves[r.run_id], curves[v.run_id]
                    deltas.append((b["loss"] - a["loss"]).dropna().rename(seed))
            if not deltas:
                continue
            table = pd.concat(deltas, axis=1)
            tokens = curves[ref.iloc[0].run_id]["tokens"] if ref.iloc[0].run_id in curves else None
            for step, values in table.iterrows():
                values = values.to_numpy(float)
                ci = t_interval(values[np.isfinite(values)])
                rows.append({"flip": flip, "direction": direction, "against": against, "group": group,
                             "step": int(step), "tokens": float(tokens.get(step, math.nan)) if tokens is not None
                             else math.nan, "n_pairs": int(np.isfinite(values).sum()),
                             **{k: ci[k] for k in ("mean_delta", "ci_low", "ci_high")}})
    return pd.DataFrame(rows, columns=EVAL_EFFECT_COLUMNS)


def _paired(ref: pd.DataFrame, var: pd.DataFrame, metric: str) -> dict | None:
    seeds = ref.index.intersection(var.index).sort_values()
    if seeds.empty:
        return None
    ref, var = ref.loc[seeds], var.loc[seeds]
    done = ((ref["status"] == COMPLETED) & (var["status"] == COMPLETED)).to_numpy()
    r = ref[metric].to_numpy(dtype=float, na_value=np.nan)
    v = var[metric].to_numpy(dtype=float, na_value=np.nan)
    relative = metric in RELATIVE_METRICS
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = 100.0 * (v / r - 1.0) if relative else v - r
    ok = done & np.isfinite(delta)
    return {"metric": metric, "n_pairs": int(ok.sum()), "excluded": int((~ok).sum()),
            "unit": "%" if relative else "abs", **t_interval(delta[ok])}


def _effects_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> EFFECT_COLUMNS, with the Holm correction over every effect of the same metric."""
    df = pd.DataFrame(rows, columns=EFFECT_COLUMNS)
    for idx in df.groupby("metric").groups.values():
        df.loc[idx, "p_holm"] = stats.holm(df.loc[idx, "p_value"].to_numpy(float))
    df["p_holm"] = df["p_holm"].astype(float)
    df["within_noise"] = pd.Series([None if not np.isfinite(p) else bool(p >= stats.ALPHA) for p in df["p_holm"]],
                                   index=df.index, dtype=object)
    m = df.groupby("metric")["p_value"].transform(lambda s: int(np.isfinite(s.to_numpy(float)).sum()))
    chance = ((df["ci_low"] > 0) | (df["ci_high"] < 0)) & df["within_noise"].eq(True)
    df.loc[chance, "note"] = ["; ".join(filter(None, [f"95% CI excludes 0, but not after Holm over {k} effects", note]))
                              for k, note in zip(m[chance], df.loc[chance, "note"])]
    order = {"flip": {f: i for i, f in enumerate(comp.BUILTIN_NAMES)}}  # built-ins in table order, then others
    df = df.sort_values(["metric", "direction", "flip", "group"], kind="stable",
                        key=lambda s: s.map(lambda f: order[s.name].get(f, len(order[s.name]))) if s.name in order else s)
    return df.reset_index(drop=True)


# ------------------------------------------------------------------------------- report files


LOSS_METRIC, SPEED_METRIC = "best_val_loss", "tokens_per_s"
OVERLAP_NOTE = "from training runs that may have shared the CPU: not a fair timing"
RUN_TABLE = ["run_id", "label", "seed", "status", "params", "active_params", "best_val_loss", "best_step",
             "final_val_loss", "overfit_gap", "bits_per_char", "tokens_per_s", "step_time_ms",
             "max_grad_norm", "loss_spikes", "diverged_at"]
EFFECT_TABLE = ["flip", "direction", "against", "group", "n_pairs", "excluded", "mean_delta", "ci_low",
                "ci_high", "p_value", "p_holm", "within_noise", "note"]
FLOAT_FORMATS = {"tokens_per_s": "{:,.0f}", "step_time_ms": "{:.1f}", "wall_s": "{:.1f}",
                 "max_grad_norm": "{:.3g}", "p_value": "{:.3g}", "p_holm": "{:.3g}"}
PCT_FORMATS = {"mean_delta": "{:+.1f}", "ci_low": "{:+.1f}", "ci_high": "{:+.1f}"}
PCT_HEADERS = {"mean_delta": "mean_delta_pct", "ci_low": "ci_low_pct", "ci_high": "ci_high_pct"}


def report_frames(root: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs, curves, effects) of every run under root; effects hold loss and speed, told apart by `metric`.

    Speed effects come from root/timing.json when a timing pass wrote one (`anatomy ablate --time`),
    else from the training runs' tokens/s, each row noted as not a fair timing.
    """
    runs, curves = load_runs(Path(root))
    record = timing.read_timing(Path(root))
    if record is not None:
        speed = timing.timing_effects(record)
    else:
        speed = _effect_rows(runs, SPEED_METRIC)
        for row in speed:
            row["note"] = "; ".join(filter(None, [OVERLAP_NOTE, row["note"]]))
    return runs, curves, _effects_frame(_effect_rows(runs, LOSS_METRIC) + speed)


def write_report(root: Path, out_dir: Path | None = None, formats: tuple[str, ...] = FORMATS,
                 frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None = None) -> dict[str, Path]:
    """Write the report files into out_dir (default <root>/report/); returns {file name: path}.

    Always the figures (forest.png, speed.png, curves.png, effects-over-training.png, grad-norm.png
    for a stability study, expert-load.png when a run is a mixture of experts); 'csv' adds runs.csv, effects.csv (loss and speed, told
    apart by `metric`) and eval-effects.csv, 'md' report.md, 'html' a self-contained report.html,
    'json' report.json ({"root", "runs", "effects", "verdict", "eval_effects"}, NaN -> null).
    `frames`, from report_frames(root), spares reading the runs again.
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown report format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    runs, curves, effects = frames if frames is not None else report_frames(root)
    out = Path(out_dir) if out_dir is not None else Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    loss, speed = effects[effects["metric"] == LOSS_METRIC], effects[effects["metric"] == SPEED_METRIC]
    verdict = vd.verdict_frame(loss)
    eval_effects = effects_by_eval(runs, curves)
    floor = vd.noise_floor(runs)
    panels = _curve_panels(runs)
    paths = {"forest.png": figures.plot_forest(verdict, out / "forest.png", floor.get("reference", (math.nan,))[0]),
             "speed.png": figures.plot_effects(speed, out / "speed.png"),
             "curves.png": figures.plot_curves(curves, panels, out / "curves.png"),
             "effects-over-training.png": figures.plot_eval_effects(eval_effects, out / "effects-over-training.png")}
    if _stability_study(Path(root), runs):
        paths["grad-norm.png"] = figures.plot_curves(curves, panels, out / "grad-norm.png", value="grad_norm")
    loads = expert_loads(runs)
    if loads:
        paths["expert-load.png"] = figures.plot_expert_load(loads, out / "expert-load.png")
    texts = {}
    if "csv" in formats:
        texts |= {"runs.csv": runs.to_csv(index=False), "effects.csv": effects.to_csv(index=False),
                  "eval-effects.csv": eval_effects.to_csv(index=False)}
    if "json" in formats:
        doc = {"root": str(root), "runs": records(runs), "effects": records(effects), "verdict": records(verdict),
               "eval_effects": records(eval_effects)}
        texts["report.json"] = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    if "md" in formats or "html" in formats:
        sections = _sections(Path(root), runs, effects, verdict, eval_effects, paths)
        lead = f"Runs under `{root}`: {len(runs)} runs ({_status_counts(runs)})."
        if "md" in formats:
            texts["report.md"] = document.markdown("anatomy report", lead, sections)
        if "html" in formats:
            texts["report.html"] = document.html_page("anatomy report", lead, sections)
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        paths[name] = out / name
    return paths


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
    out = []
    for run in _by_components(runs).drop_duplicates(["label", "settings"]).itertuples():
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


# ------------------------------------------------------------------------------- sections


def _sections(root: Path, runs, effects, verdict, eval_effects, images: dict[str, Path]) -> list[tuple[str, list]]:
    """The report in reading order: verdict, speed, curves, effects over training, runs, details, samples."""
    loss = effects[effects["metric"] == LOSS_METRIC]
    speed = effects[effects["metric"] == SPEED_METRIC]
    ctx = [c for c in runs.columns if c.startswith(CTX_PREFIX)]
    curves = [("img", images["curves.png"])] + ([("img", images["grad-norm.png"])] if "grad-norm.png" in images else [])
    return [
        ("Verdict", _verdict_blocks(root, runs, loss, verdict) + [("img", images["forest.png"])]),
        ("Speed", _speed_blocks(root, speed) + [("img", images["speed.png"])]),
        ("Curves", [("p", ("One panel per component: the runs with it flipped (its colour) against the end they "
                           "are compared with (grey); mean over seeds."))] + curves),
        ("Effects over training", _eval_blocks(eval_effects) + [("img", images["effects-over-training.png"])]),
        *([("Routing", [("p", ROUTING_NOTE), ("img", images["expert-load.png"])])] if "expert-load.png" in images else []),
        ("Runs", [("p", f"{len(runs)} runs: {_status_counts(runs)}."),
                  ("table", _display(_by_components(runs), RUN_TABLE + ctx), True)]),
        ("Effect details", [("p", LOSS_NOTE), ("table", _display(loss, _effect_columns(loss)), False)]),
        ("Samples", [("p", "One per config (its lowest seed), from the best weights."), ("samples", _samples(runs))]),
    ]


ROUTING_NOTE = ("Each mixture of experts (its lowest seed): the share of every layer's routed tokens that each "
                "expert received on the fixed validation windows with the best weights, experts ordered by load "
                "within a layer. Dashed: the uniform share 1/E. Bars far above the line mean a router that "
                "collapsed onto a few experts; the rest then barely train.")
LOSS_NOTE = ("delta = best val loss of the variant minus its end's run with the same seed (add-one: against "
             "the end with every component off, the 2017 end for the five 2017 -> LLaMA parts; remove-one: "
             "against the end with every component on, the LLaMA end); negative = the variant learns better. "
             "ci_low/ci_high: 95% Student-t interval over seeds, uncorrected; p_holm: the paired t-test's p "
             "after Holm-Bonferroni over every effect of the table; within_noise: p_holm >= 0.05.")


def _verdict_blocks(root: Path, runs: pd.DataFrame, loss: pd.DataFrame, verdict: pd.DataFrame) -> list:
    if verdict.empty:
        return [("p", "No paired runs yet: the verdict needs an end and at least one variant with a shared seed.")]
    bud, floor = vd.budget(runs), vd.noise_floor(runs)
    one_seed = (verdict["n_pairs"] <= 1).all()
    names = comp.end_names(runs.loc[runs["role"] != "", "design"].iloc[0].split("+"))
    ref_name, top_name = ("2017", "LLaMA") if names == ("2017", "llama") else names
    tested = int(np.isfinite(loss["p_value"].to_numpy(float)).sum())
    lines = [_budget_line(bud, ref_name, top_name), _noise_line(floor, ref_name, top_name)]
    if tested:
        lines.append(f"**Multiple comparisons**: {tested} effects are tested at once, so the within-noise call is "
                     f"Holm-Bonferroni corrected (family-wise 5%); the intervals shown are the uncorrected 95% "
                     f"t intervals over seeds.")
    blocks = [("p", "What each component is worth in best val loss (nats/char; positive = having the component "
                    "helps), largest first. Added = to the " + f"{ref_name} end; removed = from the {top_name} end."),
              ("table", verdict_table(verdict), False), ("list", lines)]
    if one_seed or (verdict["n_pairs"] < vd.SEEDS_WANTED).any():
        cmd, est = vd.more_seeds(root, runs)
        when = f" (est. {_fmt_time(est[0])} with {est[1]} worker{'s' * (est[1] > 1)})" if est else ""
        say = "One seed: each effect is a point estimate, no interval." if one_seed else "Fewer than 3 seeds for some configs."
        blocks += [("p", f"{say} To add seeds to {vd.SEEDS_WANTED} (finished runs are skipped){when}:"), ("code", cmd)]
    return blocks


def _budget_line(bud: dict, ref_name: str, top_name: str) -> str:
    if "steps" not in bud:
        return "**Budget**: unknown."
    text = (f"**Budget**: this holds for {bud['steps']:,} training steps"
            + (f" ({bud['tokens']:,} tokens: batch {bud['batch_size']} x ctx {bud['ctx_len']})" if "tokens" in bud else "")
            + ".")
    if "reference" in bud and "all-on" in bud:
        text += (f" There the {ref_name} end reaches {bud['reference']:.3f} and the {top_name} end "
                 f"{bud['all-on']:.3f} ({bud['reference'] - bud['all-on']:+.3f} apart).")
    if bud.get("still_improving"):
        text += (f" The {ref_name} end was still improving at its last evaluation, so a longer budget can "
                 f"shrink or reorder effects: see Effects over training.")
    return text


def _noise_line(floor: dict, ref_name: str, top_name: str) -> str:
    parts = [f"{name} end sd {sd:.4f} over {n} seeds" for role, name in (("reference", ref_name), ("all-on", top_name))
             if role in floor for sd, n in [floor[role]] if math.isfinite(sd)]
    if not parts:
        return "**Noise floor**: unknown with one seed per config (seed-to-seed spread of the ends' best val loss)."
    return f"**Noise floor** (seed-to-seed sd of best val loss): {'; '.join(parts)}."


def _fmt_time(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


def verdict_table(verdict: pd.DataFrame) -> pd.DataFrame:
    """The verdict as display strings (rank, component, change, gain, interval, seeds, p_holm, call)."""
    rows = []
    for r in verdict.itertuples():
        rows.append({"rank": str(r.rank), "component": r.flip,
                     "change": ("added to " if r.direction == "add-one" else "removed from ") + r.against
                     + (f" [{r.group}]" if r.group else ""),
                     "gain": "" if not math.isfinite(r.gain) else f"{r.gain:+.3f}",
                     "interval": f"[{r.gain_low:+.3f}, {r.gain_high:+.3f}]" if math.isfinite(r.gain_low) else
                     (vd.ONE_SEED if r.n_pairs == 1 else ""),
                     "seeds": str(r.n_pairs), "p_holm": f"{r.p_holm:.3g}" if math.isfinite(r.p_holm) else "",
                     "call": r.call})
    columns = ["rank", "component", "change", "gain", "interval", "seeds", "p_holm", "call"]
    if len(verdict) and (verdict["n_pairs"] <= 1).all():  # one seed: the interval column says it once per row
        columns = columns[:5]
    return pd.DataFrame(rows, columns=columns)


def _speed_blocks(root: Path, speed: pd.DataFrame) -> list:
    record = timing.read_timing(root)
    if record is not None:
        head = (timing.summary_line(record) + ". Each component's effect is paired within a round: 100 x (variant "
                "tokens/s / its end's - 1); positive = faster; 95% interval over rounds, within_noise Holm-corrected.")
    else:
        head = ("No timing pass in this directory: the effects below come from the training runs' tokens/s, which "
                "shared the CPU with whichever runs overlapped them, so they measure scheduling as much as the "
                "component. For a fair timing run the same `anatomy ablate` command with `--time`.")
    said_above = f"{re.escape(OVERLAP_NOTE)}|{timing.NOTE_RE}"  # the paragraph says where the numbers come from
    shown = speed.assign(note=[re.sub(said_above, "", n).strip("; ") for n in speed["note"]])
    columns = [c for c in _effect_columns(speed) if c not in ("against", "excluded", "p_value")
               and (c != "note" or (shown["note"] != "").any())]
    return [("p", head), ("table", _display(shown, columns, PCT_FORMATS).rename(columns=PCT_HEADERS), False)]


def _eval_blocks(eval_effects: pd.DataFrame) -> list:
    text = ("Each component's paired effect on val loss at every evaluation, as a gain (positive = helps): a "
            "head start that fades comes back to zero, a lasting gain stays apart.")
    if eval_effects.empty:
        return [("p", text)]
    moves = ranking_moves(eval_effects)
    return [("p", text)] + ([("p", "Ranking by gain (nats/char) early, midway and at the end:"), ("list", moves)]
                            if moves else [])


def ranking_moves(eval_effects: pd.DataFrame) -> list[str]:
    """'added, step 50: prenorm +0.272 > rope +0.246 > ...' at the first evaluation after step 0, the
    middle one and the last, per direction (the first group's effects)."""
    ev = eval_effects[(eval_effects["step"] > 0) & (eval_effects["group"] == eval_effects["group"].iloc[0])]
    out = []
    for direction, word in (("add-one", "added"), ("remove-one", "removed")):
        d = ev[ev["direction"] == direction]
        steps = sorted(d["step"].unique())
        sign = -1.0 if direction == "add-one" else 1.0
        for step in dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]] if steps else []):
            at = d[d["step"] == step]
            at = at.assign(g=sign * at["mean_delta"]).sort_values("g", ascending=False)
            out.append(f"{word}, step {step}: " + " > ".join(f"{r.flip} {r.g:+.3f}" for r in at.itertuples()))
    return out


def component_columns(runs: pd.DataFrame) -> list[str]:
    """The runs frame's per-component on/off columns: the built-ins, then spec components."""
    return [c for c in runs.columns if c in comp.BY_NAME or (c not in RUN_COLUMNS and not c.startswith(CTX_PREFIX))]


def _by_components(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs ordered by how many components they have on (the reference end first), then label."""
    n_on = runs[component_columns(runs)].sum(axis=1)
    return runs.assign(_n=n_on).sort_values(["_n", "label", "seed", "run_id"])


def _status_counts(runs: pd.DataFrame) -> str:
    return ", ".join(f"{n} {status}" for status, n in runs["status"].value_counts().items())


def _effect_columns(effects: pd.DataFrame) -> list[str]:
    # The group column only says something when there is more than one group.
    return [c for c in EFFECT_TABLE if c != "group" or (effects["group"] != "").any()]


def _display(df: pd.DataFrame, columns: list[str], formats: dict | None = None) -> pd.DataFrame:
    """The same table as strings, formatted once for both markdown and HTML."""
    formats = FLOAT_FORMATS | (formats or {})
    return pd.DataFrame({c: [_cell(v, c, formats) for v in df[c].astype(object)] for c in columns},
                        columns=columns)


def _cell(value: Any, column: str, formats: dict) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{value:,}" if column in ("params", "active_params") else str(value)
    if isinstance(value, (float, np.floating)):
        return formats.get(column, "{:.4f}").format(value)
    return str(value)


def _samples(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(heading, text) for one run per config (its lowest seed) with a samples.txt, reference end first."""
    out = []
    for run in _by_components(runs).drop_duplicates(["label", "settings"]).itertuples():
        path = Path(run.path) / SAMPLES
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            text = text[:SAMPLE_CHARS] + ("\n[...]" if len(text) > SAMPLE_CHARS else "")
            out.append((f"{run.label} · seed {run.seed} · {run.run_id}", text))
    return out
