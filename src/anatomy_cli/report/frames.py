"""Run directories -> pandas frames: one row per run, its curves long (no torch).

  load_runs          every run dir under a root -> (runs frame, long curves frame)
  records            a frame as JSON-able records (NaN -> None)
  as_written         a frame with its columns under the names the files the tool writes give them
  run_flags          still improving / overfit, from a run's best step, last evaluation and steps

A run's role comes from its own config.json, never from its name, read against the components of
its study (the sweep directory's sweep.json; the five 2017 -> LLaMA parts where there is none):
components.role. A run without summary.json reads as INCOMPLETE; losses then come from its metrics.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from anatomy_cli.data.batches import bits_per_byte
from anatomy_cli.report.plateau import PLATEAU_COLUMNS, counts_of
from anatomy_cli.report.plateau import judged as plateau_judged
from anatomy_cli.spec import components as comp
from anatomy_cli.spec import parts
from anatomy_cli.spec.config import DataConfig, ModelConfig, RunConfig, TrainConfig
from anatomy_cli.store import records as study_records
from anatomy_cli.store.runs import (
    CONFIG,
    EVAL,
    RunError,
    find_runs,
    read_config,
    read_ctx_losses,
    read_metrics,
    read_summary,
    status_of,
)
from anatomy_cli.store.summary import COLUMNS, RunSummary

INCOMPLETE = "incomplete"  # status of a run dir without summary.json (never finished, or killed)
SPIKE_FACTOR = 1.5
# Metrics whose effect is a relative change in percent (their scale depends on the hardware).
RELATIVE_METRICS = ("tokens_per_s", "step_time_ms", "wall_s", "params")
HIGHER_IS_BETTER = ("tokens_per_s",)  # every other metric: lower is better
LONG_POSITIONS = 4096  # state_bytes_4k: ModelConfig.cache_bytes, which tests pin to bench-decode's tensors
SAMPLE_CHARS = 2000  # a report shows at most this much of each samples.txt

# Summary columns (summary.COLUMNS) are RunSummary's fields marked as such, typed by it.
RUN_COLUMNS = [
    "run_id", "path", "config", "lr", "label", "role", "size", *comp.BUILTIN_NAMES, "n_layer", "n_head", "n_kv_head",
    "d_model", "seed", "status", *COLUMNS, "non_embedding_params", "state_bytes_4k", "overfit_gap", "max_grad_norm",
    "loss_spikes", "design", "settings", "corpus", "built", "warning", "bpb_per_nat",
    *PLATEAU_COLUMNS,  # report/plateau.py: a run left on the unigram plateau
]  # + a column per spec component found in sweep.json files, one val_loss_ctx_<N> per eval.json length
# config: the run's config name within its study ('2017+rope' of the run named 'demo/2017+rope', its name as it is
# for a run of `anatomy train`); lr: its train.lr. Read from the run's config.json, never from its id.
INT_COLUMNS = ("n_layer", "n_head", "n_kv_head", "d_model", "seed", "loss_spikes", "non_embedding_params",
               "state_bytes_4k", *(c for c in COLUMNS if RunSummary.kind(c) is int))
FLOAT_COLUMNS = ("lr", "max_grad_norm", "bpb_per_nat", *(c for c in COLUMNS if RunSummary.kind(c) is float))
# loss: nats per token of the run's tokenizer; bpb: the same in bits per byte (NaN where unknown: a train row, or a
# run whose bytes per token cannot be read again). grad_norm on train rows.
CURVE_COLUMNS = ["run_id", "step", "tokens", "split", "loss", "bpb", "grad_norm"]
CTX_PREFIX = "val_loss_ctx_"
# The margin and its basis under the names the written files kept from before the code said margin
# (effects.csv, report.json, results files): frames say margin, files say threshold (as_written).
FILE_NAMES = {"margin": "threshold", "margin_basis": "threshold_basis"}


# ------------------------------------------------------------------------------- loading


def load_runs(root: Path, studies: dict[Path, study_records.StudyRecord | None] | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves): one row per run dir under root, and every logged loss in long form. studies: each
    study folder's sweep.json (study_records.read_study), filled in here for every folder it lacks, so a caller
    that passes a dict reads each folder's record once for the whole report.

    runs has RUN_COLUMNS plus spec components' and val_loss_ctx_<N> columns; curves has run_id,
    step, split ('train' | 'val'), loss. `role` is 'reference', 'all-on', '+f', '-f' or '' within
    the run's study (`design`: its component names joined by '+'); `settings` is the JSON of every
    config value except name, seed and what the study's components switch: runs with equal design
    and settings differ only in components and seed. `size` names the run's rung of its study's
    size ladder ('' without one): the size whose settings (sweep.json) its config holds. `corpus` is
    the fingerprint of the text the run trained on (split_corpora keeps two corpora apart); `built`
    a hash of what it trains (equal: the same model trained alike, effects._pairings makes no call).
    """
    dirs = _run_dirs(Path(root))
    studies = {} if studies is None else studies
    designs: dict[Path, tuple[tuple[comp.Component, ...], list[dict]]] = {}
    rows, curves, corpora = [], [], {}
    for run_id, run_dir in zip(_run_ids(Path(root), dirs), dirs):
        if run_dir.parent not in designs:
            if run_dir.parent not in studies:
                studies[run_dir.parent] = study_records.read_study(run_dir.parent)
            designs[run_dir.parent] = (design_of(studies[run_dir.parent], run_dir.parent),
                                       studies[run_dir.parent].sizes if studies[run_dir.parent] else [])
        metrics = read_metrics(run_dir)
        rows.append(_run_row(run_id, run_dir, metrics, *designs[run_dir.parent]))
        rows[-1] |= plateau_judged(run_dir, metrics, rows[-1]["status"], rows[-1]["best_val_loss"], corpora)
        rows[-1] |= _per_byte(rows[-1], run_dir, corpora)
        curves.extend(_curve_rows(run_id, metrics, rows[-1]["bpb_per_nat"]))
    return _runs_frame(split_corpora(rows)), pd.DataFrame(curves, columns=CURVE_COLUMNS)


def corpus_fingerprint(summary: dict | None) -> str | None:
    """The short fingerprint of the text a run trained on (its summary's corpus_sha256, and a prepared
    folder's files), None where the summary records none (older versions, a run killed before it)."""
    summary = summary or {}
    sha, files = summary.get("corpus_sha256"), summary.get("corpus_files")
    if not isinstance(sha, str):
        return None
    if files:
        sha = hashlib.sha256(json.dumps([sha, files], sort_keys=True, default=str).encode()).hexdigest()
    return sha[:12]


def split_corpora(rows: list[dict]) -> list[dict]:
    """Runs trained on different corpora never share a group (effects.groups pairs within one): where the
    runs of one study and settings hold two fingerprints or more, each run's settings get its corpus
    ('corpus=...' in the group's name), so each corpus is its own group, paired within itself. Splitting,
    not refusing: the report of such a folder still shows every run, and each corpus's calls hold for
    it. A run that records no fingerprint joins the one corpus of its group, or with several is its own."""
    known: dict[tuple, set] = {}
    for row in rows:
        known.setdefault((row["design"], row["settings"]), set()).add(row["corpus"])
    for row in rows:
        corpora = known[(row["design"], row["settings"])] - {None}
        if len(corpora) > 1:
            row["settings"] = json.dumps({**json.loads(row["settings"]), "corpus": row["corpus"] or "unknown"},
                                         sort_keys=True, default=str)
    return rows


def design_of(study: study_records.StudyRecord | None, folder: Path) -> tuple[comp.Component, ...]:
    """The components a study folder's runs were planned with (its sweep.json's; the five without one)."""
    if study is None:
        return tuple(comp.BY_NAME[n] for n in comp.FIVE)
    try:
        return tuple(comp.from_record(r) for r in study.components)
    except (KeyError, TypeError, AttributeError) as err:
        raise RunError(f"corrupt sweep.json in {folder}: {err!r}") from None


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
    name, lr = config.get("name"), flat.get("train.lr", TrainConfig.model_fields["lr"].default)
    row = {"run_id": run_id, "path": str(run_dir),
           "config": name.partition("/")[2] or name if isinstance(name, str) else None,
           "lr": lr if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
           "label": comp.label(flat, known),
           "role": comp.role({c.name: c.state(flat) for c in design}, [c.name for c in design]),
           "size": _size_of(flat, sizes, design)}
    row |= {c.name: bool(c.state(flat)) for c in known}
    row |= {k: getattr(model, k) for k in ("n_layer", "n_head", "n_kv_head", "d_model")}
    row["non_embedding_params"] = model.non_embedding_params()
    # decode state (KV cache, windows, recurrent memory) at LONG_POSITIONS positions, batch 1, fp32
    row["state_bytes_4k"] = model.cache_bytes(1, LONG_POSITIONS, 4)
    row |= {"seed": config.get("seed"), "design": "+".join(c.name for c in design),
            "settings": comp.settings_key(flat, design), "built": _built(config, model)}
    summary = read_summary(run_dir)
    row |= _outcome(summary, metrics) | {"corpus": corpus_fingerprint(summary)}
    if row["active_params"] is None and not model.moe:  # summaries from before MoE: all of a dense model is active
        row["active_params"] = row["params"]
    warmup = config.get("train", {}).get("warmup", TrainConfig.model_fields["warmup"].default)
    row |= _stability(metrics, warmup)
    row |= _ctx_losses(run_dir)
    return row


def _built(config: dict, model: ModelConfig) -> str:
    """A short hash of what the run trains (components.built_model): two runs with one are the same model
    trained alike, whatever settings they differ in that the model does nothing with."""
    sections = {}
    for name, cls in (("train", TrainConfig), ("data", DataConfig)):
        given = config.get(name) if isinstance(config.get(name), dict) else {}
        fields = cls.model_fields  # unvalidated (an older run's file): a tuple field as JSON wrote it, a list
        sections[name] = cls.model_construct(**{k: tuple(v) if isinstance(v, list) and isinstance(
            fields[k].default, tuple) else v for k, v in given.items() if k in fields})
    cfg = RunConfig.model_construct(model=model, **sections)
    return hashlib.sha256(comp.built_model(cfg).encode()).hexdigest()[:12]


def _model_config(config: dict, run_dir: Path) -> ModelConfig:
    # Keys this version does not know are dropped, so an older report reads newer runs.
    known = {k: v for k, v in config.get("model", {}).items() if k in ModelConfig.model_fields}
    plugins = config.get("plugins")
    if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins):  # a run's plugin parts: their
        try:  # formulas (non-embedding parameters, decode state) are their files' (spec/parts.py)
            parts.load_for(plugins, known)
        except parts.PartError as err:
            raise RunError(f"{run_dir / CONFIG}: {err}") from None
    try:
        return ModelConfig.model_validate(known)
    except ValueError as err:
        first = str(err).splitlines()[-1].strip()
        raise RunError(f"invalid model config in {run_dir / CONFIG}: {first}") from None


def _outcome(summary: dict | None, metrics: list[dict]) -> dict:
    """Summary fields; losses fall back to metrics.jsonl when there is no summary yet."""
    summary = summary or {}
    out = {k: summary.get(k) for k in (*COLUMNS, "warning")}  # warning: a run that learned nothing
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


def _per_byte(row: dict, run_dir: Path, corpora: dict) -> dict:
    """A run's losses in bits per byte (the report's unit): best_val_bpb and final_val_bpb from its summary, else
    its nats per token turned by its val tokens and bytes (summary, else counted on its corpus: plateau.counts_of);
    bpb_per_nat, the factor its curves are turned by (NaN: unknown)."""
    counts = (row.get("val_tokens"), row.get("val_bytes"))
    if not all(isinstance(v, (int, float)) and v and math.isfinite(v) for v in counts):
        counts = counts_of(run_dir, corpora) if row.get("best_val_loss") is not None else None
    out = {}
    if counts:
        out |= {"val_tokens": counts[0], "val_bytes": counts[1]}
        for kind in ("best", "final"):
            if row.get(f"{kind}_val_bpb") is None and row.get(f"{kind}_val_loss") is not None:
                out[f"{kind}_val_bpb"] = bits_per_byte(row[f"{kind}_val_loss"], *counts)
    best, bpb = row.get("best_val_loss"), out.get("best_val_bpb", row.get("best_val_bpb"))
    factor = (bits_per_byte(1.0, *counts) if counts else
              bpb / best if isinstance(best, float) and isinstance(bpb, float) and best > 0 else math.nan)
    return out | {"bpb_per_nat": factor}


def _curve_rows(run_id: str, metrics: list[dict], per_nat: float = math.nan) -> list[tuple]:
    rows = []
    for m in metrics:
        for split in ("train", "val"):
            if m.get(f"{split}_loss") is not None and m.get("step") is not None:
                grad = m.get("grad_norm") if split == "train" else None
                loss = float(m[f"{split}_loss"])
                bpb = m.get("val_bpb") if split == "val" else None
                bpb = float(bpb) if isinstance(bpb, (int, float)) else loss * per_nat if split == "val" else math.nan
                rows.append((run_id, int(m["step"]), math.nan if m.get("tokens") is None else float(m["tokens"]),
                             split, loss, bpb, math.nan if grad is None else float(grad)))
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
    df["overfit_gap"] = df["final_val_bpb"] - df["best_val_bpb"]  # bits per byte, as every loss the report judges
    return df[RUN_COLUMNS + custom + ctx]


# ------------------------------------------------------------------------------- report files


# The loss every call is made on: best val loss in bits per byte (the field's unit: a character model, a BPE
# model and two tokenizers sit on one axis); NATS_METRIC, the same in nats per token of the run's tokenizer.
LOSS_METRIC, NATS_METRIC, SPEED_METRIC = "best_val_bpb", "best_val_loss", "tokens_per_s"
UNIT = "bits/byte"  # the loss unit of every answer (a results file from before says its own: results_blocks)


def components_of(runs: pd.DataFrame, studies: dict) -> dict[str, comp.Component]:
    """The components of every study under the runs, by name (about, source: the report names them); studies:
    their folders' sweep.json, as load_runs read them."""
    out: dict[str, comp.Component] = {}
    for folder in dict.fromkeys(Path(p).parent for p in runs["path"]):
        out |= {c.name: c for c in design_of(studies.get(folder), folder) if c.name not in out}
    return out


def run_flags(best_step, last_eval, steps):
    """(still improving, overfit) of a run, or elementwise of Series: its best val loss at its last
    evaluation; its best before half its steps (NaN steps: never overfit)."""
    return best_step >= last_eval, best_step < 0.5 * steps



def as_written(df: pd.DataFrame) -> pd.DataFrame:
    """df with its columns renamed as the written files name them (FILE_NAMES), in the same order."""
    return df.rename(columns=FILE_NAMES)


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
