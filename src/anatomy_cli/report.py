"""Read run directories into pandas frames and write the comparison report (no torch).

  load_runs          every run dir under a root -> (runs frame, long curves frame)
  component_effects  runs frame -> add-one / remove-one effect of each LLaMA part, paired by seed
  plot_curves        val (solid) and train (dashed) loss of every run -> PNG
  plot_effects       mean delta with a 95% CI per flip -> PNG
  write_report       all of the above -> runs.csv, effects.csv, report.md/.html/.json, two PNGs

How an effect is measured. A run's role comes from its own config.json, never from its name: the
2017 end has none of the five LLaMA parts, the LLaMA end has all five, an add-one run has exactly
one, a remove-one run has all but one. Runs are compared only inside a group that shares every
config value except the five switches (norm_type, norm_pos, pos_type, ffn_type, n_kv_head) and
the seed, and only pairs with the same seed are differenced (same data order, same init stream):
  add-one f     delta = metric(2017 + f)        - metric(2017 end)
  remove-one f  delta = metric(LLaMA end - f)   - metric(LLaMA end)
For speed-like metrics (RELATIVE_METRICS) the delta is a relative change in percent instead:
100 * (variant / reference - 1). Only pairs whose two runs completed count; the rest are tallied
in `excluded` (a diverged run is a result to report, not a number to average).

Library code: returns data or writes files, never prints or exits; problems raise RunError or
ValueError with a one-line message. Figures use matplotlib's object API (no pyplot global state).
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from anatomy_cli.config import FLIPS, ModelConfig, TrainConfig
from anatomy_cli.runs import (
    COMPLETED, CONFIG, SAMPLES, RunError, atomic_write_text, find_runs, read_config, read_ctx_losses, read_metrics,
    read_summary,
)

EVAL = "eval.json"  # optional: {"val_loss_by_ctx": {"128": 1.52, "512": null}, ...}
INCOMPLETE = "incomplete"  # status of a run dir without summary.json (never finished, or killed)
SWITCH_KEYS = ("norm_type", "norm_pos", "pos_type", "ffn_type", "n_kv_head")
SPIKE_FACTOR = 1.5
# Metrics whose effect is a relative change in percent (their scale depends on the hardware).
RELATIVE_METRICS = ("tokens_per_s", "step_time_ms", "wall_s", "params")
FORMATS = ("md", "html", "csv", "json")
SAMPLE_CHARS = 2000  # a report shows at most this much of each samples.txt

# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30; beyond 30 the normal 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

RUN_COLUMNS = [
    "run_id", "path", "label", *FLIPS, "n_layer", "n_head", "n_kv_head", "d_model", "seed",
    "params", "status", "best_val_loss", "best_step", "final_val_loss", "overfit_gap",
    "bits_per_char", "tokens_per_s", "step_time_ms", "wall_s", "diverged_at", "max_grad_norm",
    "loss_spikes", "settings",
]  # + one val_loss_ctx_<N> column per context length found in eval.json files
INT_COLUMNS = ("n_layer", "n_head", "n_kv_head", "d_model", "seed", "params", "best_step",
               "diverged_at", "loss_spikes")
FLOAT_COLUMNS = ("best_val_loss", "final_val_loss", "bits_per_char", "tokens_per_s",
                 "step_time_ms", "wall_s", "max_grad_norm")
SUMMARY_KEYS = ("params", "best_val_loss", "best_step", "final_val_loss", "bits_per_char",
                "tokens_per_s", "step_time_ms", "wall_s", "diverged_at")
CURVE_COLUMNS = ["run_id", "step", "split", "loss"]
EFFECT_COLUMNS = ["metric", "flip", "direction", "group", "n_pairs", "excluded", "mean_delta",
                  "ci_low", "ci_high", "unit", "within_noise", "note"]
CTX_PREFIX = "val_loss_ctx_"


# ------------------------------------------------------------------------------- loading


def load_runs(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves): one row per run dir under root, and every logged loss in long form.

    runs has RUN_COLUMNS plus val_loss_ctx_<N> columns; curves has run_id, step, split
    ('train' | 'val'), loss. `settings` is the JSON of every config value except name, seed and
    the five switches: runs with equal settings differ only in components and seed.
    """
    dirs = _run_dirs(Path(root))
    rows, curves = [], []
    for run_id, run_dir in zip(_run_ids(Path(root), dirs), dirs):
        metrics = read_metrics(run_dir)
        rows.append(_run_row(run_id, run_dir, metrics))
        curves.extend(_curve_rows(run_id, metrics))
    return _runs_frame(rows), pd.DataFrame(curves, columns=CURVE_COLUMNS)


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


def _run_row(run_id: str, run_dir: Path, metrics: list[dict]) -> dict:
    config = read_config(run_dir)
    model = _model_config(config, run_dir)
    row = {"run_id": run_id, "path": str(run_dir), "label": model.label}
    row |= {f: f in model.flips for f in FLIPS}
    row |= {k: getattr(model, k) for k in ("n_layer", "n_head", "n_kv_head", "d_model")}
    row |= {"seed": config.get("seed"), "settings": _settings_key(config)}
    row |= _outcome(read_summary(run_dir), metrics)
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


def _settings_key(config: dict) -> str:
    """JSON of the flattened config minus name, seed and the five component switches."""
    flat = _flatten({k: v for k, v in config.items() if k not in ("name", "seed")})
    return json.dumps({k: v for k, v in flat.items() if k.removeprefix("model.") not in SWITCH_KEYS},
                      sort_keys=True)


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _outcome(summary: dict | None, metrics: list[dict]) -> dict:
    """Summary fields; losses fall back to metrics.jsonl when there is no summary yet."""
    summary = summary or {}
    out = {k: summary.get(k) for k in SUMMARY_KEYS}
    out["status"] = summary.get("status") or INCOMPLETE
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
                rows.append((run_id, int(m["step"]), split, float(m[f"{split}_loss"])))
    return rows


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    ctx = sorted((c for c in df.columns if c.startswith(CTX_PREFIX)),
                 key=lambda c: int(c.removeprefix(CTX_PREFIX)))
    for col in INT_COLUMNS:  # nullable ints: a missing params or diverged_at stays <NA>
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    for col in (*FLOAT_COLUMNS, *ctx):
        df[col] = pd.to_numeric(df[col]).astype(float)
    df["overfit_gap"] = df["final_val_loss"] - df["best_val_loss"]
    return df[RUN_COLUMNS + ctx]


# ------------------------------------------------------------------------------- effects


def component_effects(runs_df: pd.DataFrame, metric: str = "best_val_loss") -> pd.DataFrame:
    """Add-one and remove-one effect of each flip on `metric`, paired by seed (EFFECT_COLUMNS).

    mean_delta/ci_low/ci_high are in the metric's units (unit 'abs'), or, for RELATIVE_METRICS
    such as tokens_per_s, a relative change in percent (unit '%'). The CI is a 95% Student-t
    interval over the paired differences; within_noise is True when it contains 0 and None with
    fewer than two pairs. `excluded` counts pairs skipped because a run did not complete (or
    lacks the metric).
    """
    return _effects_frame(_effect_rows(runs_df, metric))


def _effect_rows(runs_df: pd.DataFrame, metric: str) -> list[dict]:
    if metric not in runs_df.columns:
        raise ValueError(f"unknown metric {metric!r}: not a column of the runs frame")
    runs = runs_df.assign(role=[_role(r) for r in runs_df[list(FLIPS)].itertuples(index=False)])
    runs = runs[runs["role"].notna()]
    rows = []
    for group, members in _groups(runs):
        rows += _group_effects(members, group, metric)
    return rows


def _role(flags: tuple) -> str | None:
    """'2017' | 'llama' | '+f' (add-one) | '-f' (remove-one); None for any other mix."""
    on = [f for f, flag in zip(FLIPS, flags) if flag]
    if not on:
        return "2017"
    if len(on) == len(FLIPS):
        return "llama"
    if len(on) == 1:
        return f"+{on[0]}"
    if len(on) == len(FLIPS) - 1:
        return f"-{next(f for f in FLIPS if f not in on)}"
    return None


def _groups(runs: pd.DataFrame):
    """(label, runs) per shared settings. Where gqa runs use several n_kv_head values (an axis),
    each value gets its own group, sharing the runs without gqa (they have no such value)."""
    names = _group_names(runs["settings"])
    for settings, members in runs.groupby("settings", sort=True):
        kvs = sorted(members.loc[members["gqa"], "n_kv_head"].unique())
        if len(kvs) <= 1:
            yield names[settings], members
            continue
        for kv in kvs:
            keep = ~members["gqa"] | (members["n_kv_head"] == kv)
            yield ", ".join(filter(None, [names[settings], f"n_kv_head={kv}"])), members[keep]


def _group_names(settings: pd.Series) -> dict[str, str]:
    """'n_layer=12, train.lr=0.001': only the settings that differ between groups ('' if none)."""
    parsed = {s: json.loads(s) for s in settings.unique()}
    keys = sorted(set().union(*parsed.values())) if parsed else []
    varying = [k for k in keys if len({json.dumps(p.get(k)) for p in parsed.values()}) > 1]
    return {s: ", ".join(f"{k.removeprefix('model.')}={p.get(k)}" for k in varying)
            for s, p in parsed.items()}


def _group_effects(members: pd.DataFrame, group: str, metric: str) -> list[dict]:
    # One run per role and seed: a config run twice (two sweeps) counts once, the first by id.
    members = members.sort_values("run_id").drop_duplicates(["role", "seed"])
    by_role = {role: sub.set_index("seed") for role, sub in members.groupby("role")}
    rows = []
    for flip in FLIPS:
        for direction, ref, var in (("add-one", "2017", f"+{flip}"), ("remove-one", "llama", f"-{flip}")):
            if ref in by_role and var in by_role:
                row = _paired(by_role[ref], by_role[var], metric)
                if row:
                    rows.append({"flip": flip, "direction": direction, "group": group, **row})
    return rows


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


def t_interval(deltas: np.ndarray) -> dict:
    """Mean and 95% Student-t CI of paired differences, within_noise, and a note."""
    n = len(deltas)
    out = {"mean_delta": float(np.mean(deltas)) if n else math.nan, "ci_low": math.nan,
           "ci_high": math.nan, "within_noise": None, "note": ""}
    if n == 0:
        out["note"] = "no completed pairs"
    elif n == 1:
        out["note"] = "CI unavailable with one seed"
    else:
        t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
        half = t * float(np.std(deltas, ddof=1)) / math.sqrt(n)
        out |= {"ci_low": out["mean_delta"] - half, "ci_high": out["mean_delta"] + half}
        out["within_noise"] = bool(out["ci_low"] <= 0.0 <= out["ci_high"])
    return out


def _effects_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=EFFECT_COLUMNS)
    order = {"flip": {f: i for i, f in enumerate(FLIPS)}}
    df = df.sort_values(["metric", "direction", "flip", "group"], kind="stable",
                        key=lambda s: s.map(order[s.name]) if s.name in order else s)
    return df.reset_index(drop=True)


# ------------------------------------------------------------------------------- figures


def plot_curves(curves_df: pd.DataFrame, path: Path) -> Path:
    """Val loss (solid) and train loss (dashed, same colour) of every run, overlaid.

    Per-step train losses are smoothed for the figure only (a centred rolling mean over ~2% of the
    run): raw minibatch noise hides the differences the figure is for. The CSV/JSON keep raw values.
    """
    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    data = curves_df[np.isfinite(curves_df["loss"].to_numpy(dtype=float))]
    colors = colormaps["tab20"]
    for i, (run_id, run) in enumerate(data.groupby("run_id", sort=True)):
        for split, style, alpha in (("val", ".-", 1.0), ("train", "--", 0.45)):
            part = run[run["split"] == split].sort_values("step")
            if split == "train" and len(part) > 50:
                window = max(2, len(part) // 50)
                part = part.assign(loss=part["loss"].rolling(window, center=True, min_periods=1).mean())
            label = run_id if split == "val" or not (run["split"] == "val").any() else None
            if len(part):
                ax.plot(part["step"], part["loss"], style, color=colors(i % 20), alpha=alpha,
                        linewidth=1.2, markersize=4, label=label, zorder=3 if split == "val" else 2)
    _curve_axes(fig, ax, data)
    return _save(fig, path)


def _curve_axes(fig: Figure, ax, data: pd.DataFrame) -> None:
    ax.set(xlabel="step", ylabel="loss (nats/char)", title="val loss (solid), train loss (dashed, smoothed)")
    if data.empty:
        ax.text(0.5, 0.5, "no losses logged yet", ha="center", va="center", transform=ax.transAxes)
        return
    val = data.loc[data["split"] == "val", "loss"]
    train = data.loc[data["split"] == "train", "loss"]
    if len(val):  # a diverged run's huge train loss should not flatten everyone else's curve
        top = max(val.max(), train.quantile(0.9) if len(train) else val.max())
        ax.set_ylim(data["loss"].min() * 0.97, top * 1.05)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small", ncols=1 + data["run_id"].nunique() // 25)


def plot_effects(effects_df: pd.DataFrame, path: Path) -> Path:
    """Horizontal bars of mean delta with 95% CI error bars: add-one | remove-one, a row per metric."""
    metrics = list(dict.fromkeys(effects_df["metric"])) or ["best_val_loss"]
    n_bars = max([len(effects_df[effects_df["metric"] == m]) for m in metrics] + [2])
    fig = Figure(figsize=(12, 1.5 + 0.3 * n_bars * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 2, squeeze=False)
    for row, metric in enumerate(metrics):
        for col, direction in enumerate(("add-one", "remove-one")):
            cell = effects_df[(effects_df["metric"] == metric) & (effects_df["direction"] == direction)]
            ref = "2017 end" if direction == "add-one" else "LLaMA end"
            _effect_bars(axes[row][col], cell, f"{direction} vs {ref}: {metric}")
    fig.suptitle("mean paired delta, 95% CI; grey = CI contains 0 or one seed", fontsize="medium")
    return _save(fig, path)


def _effect_bars(ax, cell: pd.DataFrame, title: str) -> None:
    ax.set_title(title, fontsize="medium")
    if cell.empty:
        ax.text(0.5, 0.5, "no paired runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    mean = cell["mean_delta"].to_numpy(dtype=float)
    err = np.nan_to_num([mean - cell["ci_low"].to_numpy(float), cell["ci_high"].to_numpy(float) - mean])
    # Blue only where the CI excludes 0; None (one seed) and NaN count as not established.
    colors = ["tab:gray" if w is None or bool(w) else "tab:blue" for w in cell["within_noise"]]
    y = np.arange(len(cell))
    ax.barh(y, np.nan_to_num(mean), xerr=err, color=colors, capsize=3)
    ax.axvline(0.0, color="black", linewidth=0.8)
    labels = [f"{r.flip}{f' [{r.group}]' if r.group else ''} (n={r.n_pairs})" for r in cell.itertuples()]
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("delta (%)" if (cell["unit"] == "%").all() else "delta")


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # attach an Agg canvas explicitly: no backend switching, no pyplot
    fig.savefig(path, dpi=110)
    return Path(path)


# ------------------------------------------------------------------------------- report files


LOSS_METRIC, SPEED_METRIC = "best_val_loss", "tokens_per_s"
LOSS_NOTE = ("delta = best val loss of the variant minus its reference run with the same seed "
             "(add-one: the 2017 end; remove-one: the LLaMA end). Negative = the variant learns "
             "better. 95% Student-t CI over seeds; within_noise = the CI contains 0.")
SPEED_NOTE = ("delta = 100 x (variant tokens/s / reference tokens/s - 1), paired by seed. "
              "Positive = the variant trains faster. Only meaningful on one machine.")
RUN_TABLE = ["run_id", "label", "seed", "status", "params", "best_val_loss", "best_step",
             "final_val_loss", "overfit_gap", "bits_per_char", "tokens_per_s", "step_time_ms",
             "max_grad_norm", "loss_spikes", "diverged_at"]
EFFECT_TABLE = ["flip", "direction", "group", "n_pairs", "excluded", "mean_delta", "ci_low",
                "ci_high", "within_noise", "note"]
FLOAT_FORMATS = {"tokens_per_s": "{:,.0f}", "step_time_ms": "{:.1f}", "wall_s": "{:.1f}",
                 "max_grad_norm": "{:.3g}"}
PCT_FORMATS = {"mean_delta": "{:+.1f}", "ci_low": "{:+.1f}", "ci_high": "{:+.1f}"}
TEXT_COLUMNS = ("run_id", "label", "status", "flip", "direction", "group", "within_noise", "note")
PCT_HEADERS = {"mean_delta": "mean_delta_pct", "ci_low": "ci_low_pct", "ci_high": "ci_high_pct"}


def report_frames(root: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs, curves, effects) of every run under root; effects hold loss and speed, told apart by `metric`."""
    runs, curves = load_runs(Path(root))
    return runs, curves, _effects_frame(_effect_rows(runs, LOSS_METRIC) + _effect_rows(runs, SPEED_METRIC))


def write_report(root: Path, out_dir: Path | None = None, formats: tuple[str, ...] = FORMATS,
                 frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None = None) -> dict[str, Path]:
    """Write the report files into out_dir (default <root>/report/); returns {file name: path}.

    Always curves.png and effects.png; 'csv' adds runs.csv and effects.csv (loss and speed effects
    in one table, told apart by `metric`), 'md' report.md, 'html' a self-contained report.html,
    'json' report.json ({"root", "runs", "effects"} as records, NaN -> null). `frames`, from
    report_frames(root), spares reading the runs again when the caller already has them.
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown report format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    runs, curves, effects = frames if frames is not None else report_frames(root)
    out = Path(out_dir) if out_dir is not None else Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"curves.png": plot_curves(curves, out / "curves.png"),
             "effects.png": plot_effects(effects, out / "effects.png")}
    texts = _report_texts(Path(root), runs, effects, paths, formats)
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        paths[name] = out / name
    return paths


def _report_texts(root: Path, runs: pd.DataFrame, effects: pd.DataFrame,
                  images: dict[str, Path], formats: tuple[str, ...]) -> dict[str, str]:
    texts = {}
    if "csv" in formats:
        texts["runs.csv"] = runs.to_csv(index=False)
        texts["effects.csv"] = effects.to_csv(index=False)
    if "json" in formats:
        doc = {"root": str(root), "runs": records(runs), "effects": records(effects)}
        texts["report.json"] = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    sections = _sections(runs, effects)
    samples = _samples(runs)
    if "md" in formats:
        texts["report.md"] = _markdown(root, sections, images, samples)
    if "html" in formats:
        texts["report.html"] = _html(root, sections, images, samples)
    return texts


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


def _sections(runs: pd.DataFrame, effects: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(title, note, display table of strings) for the run table and the two effect tables."""
    ctx = [c for c in runs.columns if c.startswith(CTX_PREFIX)]
    ordered = runs.assign(_n=runs[list(FLIPS)].sum(axis=1)).sort_values(["_n", "label", "seed", "run_id"])
    speed = effects[effects["metric"] == SPEED_METRIC]
    return [
        ("Runs", f"{len(runs)} runs: {_status_counts(runs)}.", _display(ordered, RUN_TABLE + ctx)),
        (f"Component effects: {LOSS_METRIC}", LOSS_NOTE,
         _display(effects[effects["metric"] == LOSS_METRIC], _effect_columns(effects))),
        (f"Component effects: speed ({SPEED_METRIC})", SPEED_NOTE,
         _display(speed, _effect_columns(effects), PCT_FORMATS).rename(columns=PCT_HEADERS)),
    ]


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
        return f"{value:,}" if column == "params" else str(value)
    if isinstance(value, (float, np.floating)):
        return formats.get(column, "{:.4f}").format(value)
    return str(value)


def _samples(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(heading, text) for each run with a samples.txt, 2017 end first, LLaMA end last."""
    out = []
    ordered = runs.assign(_n=runs[list(FLIPS)].sum(axis=1)).sort_values(["_n", "label", "seed", "run_id"])
    for run in ordered.itertuples():
        path = Path(run.path) / SAMPLES
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            text = text[:SAMPLE_CHARS] + ("\n[...]" if len(text) > SAMPLE_CHARS else "")
            out.append((f"{run.label} · seed {run.seed} · {run.run_id}", text))
    return out


def _markdown(root: Path, sections, images: dict[str, Path], samples) -> str:
    parts = [f"# anatomy report\n\nRuns under `{root}`."]
    for title, note, table in sections:
        body = _md_table(table) if len(table) else "_No paired runs._"
        parts.append(f"## {title}\n\n{note}\n\n{body}")
    parts.append("## Figures\n\n" + "\n\n".join(f"![{p.stem}]({p.name})" for p in images.values()))
    parts.append("## Samples\n\n" + ("\n\n".join(_md_sample(h, t) for h, t in samples) or "_None._"))
    return "\n\n".join(parts) + "\n"


def _md_table(table: pd.DataFrame) -> str:
    # Cells are preformatted strings: no number parsing, but numbers still align right.
    align = ["left" if c in TEXT_COLUMNS else "right" for c in table.columns]
    return table.to_markdown(index=False, disable_numparse=True, colalign=align)


def _md_sample(heading: str, text: str) -> str:
    # The corpus is markdown, so a sample may hold ``` itself: fence with one backtick more.
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"### {heading}\n\n{fence}text\n{text.rstrip()}\n{fence}"


HTML_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}
th{background:#f3f3f3}img{max-width:100%}.samples{display:grid;gap:1em;
grid-template-columns:repeat(auto-fill,minmax(24em,1fr))}pre{white-space:pre-wrap;
background:#f7f7f7;padding:.6em;font-size:12px}figcaption{font-weight:600}"""


def _html(root: Path, sections, images: dict[str, Path], samples) -> str:
    esc = html.escape
    parts = [f"<h1>anatomy report</h1><p>Runs under <code>{esc(str(root))}</code>.</p>"]
    for title, note, table in sections:
        body = table.to_html(index=False, border=0) if len(table) else "<p><em>No paired runs.</em></p>"
        parts.append(f"<h2>{esc(title)}</h2><p>{esc(note)}</p>{body}")
    parts.append("<h2>Figures</h2>" + "".join(_img_tag(p) for p in images.values()))
    cards = "".join(f"<figure><figcaption>{esc(h)}</figcaption><pre>{esc(t)}</pre></figure>"
                    for h, t in samples)
    parts.append(f"<h2>Samples</h2><div class=\"samples\">{cards or '<p><em>None.</em></p>'}</div>")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>anatomy report</title>"
            f"<style>{HTML_STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _img_tag(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f"<p><img alt=\"{html.escape(path.stem)}\" src=\"data:image/png;base64,{data}\"></p>"
