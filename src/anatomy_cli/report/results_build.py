"""A Report as its study's results file (no torch): what `anatomy report RUNS_DIR --results PATH` writes.

  build          a Report (report/build.py) -> the results document (report/results_file.py's ResultsFile)
  write_results  the document, written atomically

Numbers are rounded as every file so far was written: losses to 6 decimals, learning rates to 6 significant
digits, NaN as null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from anatomy_cli.report import frames as frames_mod
from anatomy_cli.report import lr_comparison, plateau
from anatomy_cli.report import verdict as vd
from anatomy_cli.report.build import Report
from anatomy_cli.report.frames import UNIT
from anatomy_cli.report.results_file import EFFECT_KEYS, FORMAT, VERSION
from anatomy_cli.spec.roles import ALL_ON, REFERENCE
from anatomy_cli.store.runs import atomic_write_text


def build(r: Report) -> dict:
    """The results document of a Report (report/build.py's)."""
    from anatomy_cli.report import sections

    runs = r.runs
    ref, top = sections.end_names(runs)
    floor = vd.noise_floor(runs)
    ends = {role: {"name": name, "mean": _num(floor[role][2]), "sd": _num(floor[role][0]), "seeds": floor[role][1],
                   **_fit(runs, role)}
            for role, name in ((REFERENCE, ref), (ALL_ON, top)) if role in floor}
    eval_gains = [{"flip": f, "direction": d, "group": g, "steps": [int(x) for x in cell["step"]],
                   "tokens": [_num(x, 0) for x in cell["tokens"]], "gain": [_num(x, 4) for x in cell["gain"]]}
                  for (f, d, g), cell in r.eval_effects.groupby(["flip", "direction", "group"], sort=False)]
    scaled = {} if r.scale is None else {"scale": {k: [{c: _plain(v) for c, v in row.items()} for row in rows]
                                                   if isinstance(rows, list) else rows
                                                   for k, rows in r.scale.record().items()}}
    scaled |= {"decide": r.rules.decide.model_dump(mode="json")} if r.rules.decide is not None else {}
    scaled |= {"tuning": _tuning_record(r.tuning)} if r.tuning is not None else {}
    scaled |= {"tokenizers": list(r.tokenizers)} if r.tokenizers else {}
    escape = plateau.escape_record(runs, r.curves)
    scaled |= {"plateau": escape} if escape is not None else {}
    scaled |= {"worth": _worth_record(r)} if r.ladder is not None else {}
    return {"format": FORMAT, "version": VERSION, "study": Path(r.root).name, "unit": UNIT,
            "runs": {"total": len(runs), "completed": int((runs["status"] == "completed").sum())},
            "seeds": sorted(int(s) for s in runs["seed"].dropna().unique()),
            "budget": {k: _num(v) if isinstance(v, float) else v for k, v in vd.budget(runs).items()},
            "ends": ends,
            "effects": [{k: _plain(row[k]) for k in EFFECT_KEYS}
                        for row in frames_mod.records(frames_mod.as_written(r.effects))],
            "eval_gains": eval_gains, "configs": _configs(runs), **_per_byte(runs), **scaled}


def _worth_record(r: Report) -> dict:
    """The ladder's record (report/ladder.py), numbers rounded as every file's; multipliers to 6 significant
    digits (a FLOPs count keeps its size)."""
    def plain(v):
        return _sig(v) if isinstance(v, float) else v

    return {k: [{c: plain(v) for c, v in row.items()} for row in v] if isinstance(v, list) and v and
            isinstance(v[0], dict) else plain(v) for k, v in r.ladder.record().items()}


def _per_byte(runs) -> dict:
    """The study's validation windows in tokens and bytes ("per_byte"), what its losses were turned into bits per
    byte by: the median over its runs (one corpus and one set of windows: they agree); none where unknown, or where
    its runs evaluate on several (a study of two tokenizers: each its own windows, no one constant)."""
    counts = runs[["val_tokens", "val_bytes"]].dropna() if {"val_tokens", "val_bytes"} <= set(runs) else None
    if counts is None or counts.empty or len(counts.drop_duplicates()) > 1:
        return {}
    tokens, size = (int(counts[c].median()) for c in ("val_tokens", "val_bytes"))
    return {"per_byte": {"val_tokens": tokens, "val_bytes": size}}


def _fit(runs, role: str) -> dict:
    """Where an end's runs (verdict.end_runs, as its mean and sd) reached their best val loss and
    where they ended: median best step, last step, mean val loss at the last evaluation."""
    from anatomy_cli.report.verdict import end_runs

    best = end_runs(runs, role)
    if best.empty or best["best_step"].isna().all():
        return {}
    last = json.loads(best["settings"].iloc[0]).get("train.steps")  # completed: trained to its steps
    return {"best_step": int(best["best_step"].median()), "last_step": last,
            "final": _num(best["final_val_bpb"].mean())}


def _tuning_record(t: lr_comparison.Tuned) -> dict:
    """A tuned study's "tuning": its grid, selection seeds, each config's choice, and the comparison's rows
    (lr_comparison.comparison; LRs to six significant digits, the rest as the file's other numbers)."""
    r = t.record
    arms = [{"name": a.arm, "lr": _sig(a.lr), "best_loss": _num(a.best_loss), "sensitivity": _num(a.sensitivity),
             "reason": a.reason, "lrs": [_sig(x) for x in a.lrs]} for a in r.arms]
    rows = [{k: _sig(v) if k in ("end_lr", "variant_lr") else _plain(v) for k, v in row.items()}
            for row in frames_mod.records(t.comparison)]
    return {"grid": r.grid.model_dump(mode="json"), "seeds": list(r.seeds), "arms": arms, "comparison": rows}


def _configs(runs) -> list[dict]:
    """What each config of the study costs, by role: parameters (total, active per token) and its
    decode state at frames.LONG_POSITIONS positions (batch 1, fp32)."""
    keys = ("params", "active_params", "state_bytes_4k")
    rows = runs[(runs["role"] != "") & (runs["status"] == "completed")]
    return [{"role": role, "positions": frames_mod.LONG_POSITIONS,
             **{k: None if k not in sub or sub[k].isna().all() else int(sub[k].median()) for k in keys}}
            for role, sub in rows.groupby("role", sort=True)]


def write_results(path: Path, r: Report) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(build(r), indent=1, allow_nan=False) + "\n")
    return path


def _num(x, digits: int = 6):
    return None if x is None or not math.isfinite(float(x)) else round(float(x), digits)


def _sig(x, digits: int = 6):
    """A learning rate: `digits` significant digits (2e-05 kept whole, where _num's decimals would round it)."""
    return None if x is None or not math.isfinite(float(x)) else float(f"{float(x):.{digits - 1}e}")


def _plain(v):
    return _num(v) if isinstance(v, float) else v

