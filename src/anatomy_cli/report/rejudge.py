"""A results file judged again by today's rule, from what it records (no runs needed; no torch).

A shipped study's runs are not kept, but its results file holds what the rule needs: each effect's
seeds, gain and raw 95 % interval (so its paired sd: sd = half-width x sqrt(n) / t_{n-1}(0.975)), its
family's alpha ((1 - level) x family) and margin, and each trend's per-seed slope statistics. So when
the rule changes (issue 35: no variance borrows from another's), every shipped call can be judged again
exactly as `anatomy report` would judge the same runs today:

  rejudge   a results document -> (the document judged again, one line per call that changed)
  rejudge_files  `anatomy rejudge FILE ... [--check]`: rewrite each file (or only list the changes, exit 1
            if any), the CLI printing a markdown table of the calls that changed

What is judged again: the loss effects of every group (stats.judge at the family's recorded alpha and
margin), the speed effects (a speed effect from training runs is `not timed`, as report.build judges it
since issue 37; a timing pass's are judged like the loss), and a size ladder's by-size calls and trends
(scale.scale_call on the slopes judged again). What is not: a --decide study's rounds (which seeds each
look trained was decided by the rule of its day; decide.json keeps that record as it was).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from scipy import stats as sps

from anatomy_cli.report import results_bpb, stats
from anatomy_cli.report.effects import OVERLAP_NOTE
from anatomy_cli.report.frames import SPEED_METRIC
from anatomy_cli.report.results_build import _plain
from anatomy_cli.report.results_file import LOSS_UNITS, ResultsError, load
from anatomy_cli.spec.errors import InputError

# What judging a call again reads from each row: present in every file the writer wrote, the names non-null, the
# numbers null only where the writer writes null (an effect or a trend without two pairs, which no interval decides).
NEEDED = ("metric", "group", "flip", "direction", "call", "n_pairs")
NUMBERS = ("gain", "raw_low", "raw_high")
TREND_NEEDED = ("series", "flip", "direction", "sizes", "n_seeds", "call")
TREND_NUMBERS = ("slope", "slope_low", "slope_high", "fit_smallest", "fit_largest")


def check_judgeable(path: Path, doc: dict) -> None:
    """Refuse (ResultsError: one line naming the file and the field) a results file that its typed model accepts
    (every key may be absent) but whose calls cannot be judged again from what it holds."""
    for i, e in enumerate(doc.get("effects") or []):
        _require(path, f"effects[{i}]", e, NEEDED, NUMBERS, tested=e.get("n_pairs") is not None and e["n_pairs"] >= 2)
        level, family = e.get("adj_level"), e.get("family")
        if level is not None and family and not 0 < (1 - level) * family < 1:
            raise ResultsError(f"{path}: effects[{i}].adj_level is {level:g} with family {family:g}: no family-wise "
                               f"alpha between 0 and 1 judged it")
    scale = doc.get("scale") or {}
    for i, t in enumerate(scale.get("trends") or []):
        _require(path, f"scale.trends[{i}]", t, TREND_NEEDED, TREND_NUMBERS,
                 tested=None not in (t.get("sizes"), t.get("n_seeds")) and t["sizes"] >= 2 and t["n_seeds"] >= 2)
    for i, row in enumerate(scale.get("effects") or []):
        _require(path, f"scale.effects[{i}]", row, ("series", "flip", "direction", "size", "call"), (), tested=False)
    for i, size in enumerate(scale.get("sizes") or []):
        _require(path, f"scale.sizes[{i}]", size, ("series",), ("non_embedding_params",), tested=False)


def _require(path: Path, where: str, row: dict, needed: tuple, numbers: tuple, tested: bool) -> None:
    for key in needed + numbers:
        if key not in row:
            raise ResultsError(f"{path}: {where}.{key} is missing: its call is judged again from it")
        if row[key] is None and (key in needed or tested):
            raise ResultsError(f"{path}: {where}.{key} is null" + (" where two pairs or more measured it" if tested
                                                                   and key not in needed else ""))


def paired_of(row: dict, n: float, gain: float | None, low: float | None, high: float | None) -> dict:
    """A stats.paired dict from a recorded effect: n pairs, gain and raw 95 % interval [low, high] (null: NaN)."""
    gain, low, high = (math.nan if v is None else v for v in (gain, low, high))
    out = dict(row) | {"n_pairs": int(n), "gain": gain, "raw_low": low, "raw_high": high, "sd": math.nan}
    if n >= 2 and all(isinstance(v, (int, float)) and math.isfinite(v) for v in (gain, low, high)):
        out["sd"] = (high - low) / 2 * math.sqrt(n) / float(sps.t.ppf(1 - stats.ALPHA / 2, n - 1))
    return out


def allowance_of(row: dict) -> dict:
    """A tuned study's loss effect's widening for its LR selection's error, {allow_low, allow_high}: as the file
    records it, or in a file from before it was recorded, recovered from the interval that holds it (the adjusted
    interval less the t interval of its level: adj_low = gain - crit x se - allow_low, adj_high alike)."""
    if "allow_low" in row or "allow_high" in row:
        return {k: math.nan if row.get(k) is None else row[k] for k in ("allow_low", "allow_high")}
    n, keys = row["n_pairs"], ("gain", "raw_low", "raw_high", "adj_low", "adj_high", "adj_level")
    if n < 2 or any(row.get(k) is None for k in keys):
        return {}
    se = (row["raw_high"] - row["raw_low"]) / 2 / float(sps.t.ppf(1 - stats.ALPHA / 2, n - 1))
    crit = float(sps.t.ppf(1 - (1 - row["adj_level"]) / 2, n - 1))
    return {"allow_low": max(0.0, row["gain"] - crit * se - row["adj_low"]),
            "allow_high": max(0.0, row["adj_high"] - row["gain"] - crit * se)}


def _alpha(rows: list[dict]) -> float:
    """The family-wise alpha a family was judged at: (1 - level) x m, from any of its tested rows."""
    for r in rows:
        if r.get("adj_level") is not None and r.get("family"):
            return round((1 - r["adj_level"]) * r["family"], 6)
    return stats.ALPHA


def _judged(rows: list[dict], margin: float, alpha: float, tuned: bool = False) -> list[dict]:
    allowances = [allowance_of(r) if tuned else {} for r in rows]
    fresh = stats.judge([paired_of(r, r["n_pairs"], r["gain"], r["raw_low"], r["raw_high"]) | allow
                         for r, allow in zip(rows, allowances)], margin, alpha)
    out = []
    for old, new, allow in zip(rows, fresh, allowances):
        row = {k: v for k, v in old.items() if k != "prior_df"}
        # the allowance recorded: judging the file again reads it, not recovers it from an interval it widened
        row |= {k: _plain(v) if math.isfinite(v) else None for k, v in allow.items()}
        for key in ("adj_low", "adj_high", "adj_level", "family", "df", "mde", "p_holm", "call"):
            value = new[key]
            row[key] = None if isinstance(value, float) and not math.isfinite(value) else _plain(value)
        out.append(row)
    return out


def rejudge(doc: dict) -> tuple[dict, list[dict]]:
    """(the document with every call judged again, the changes: {study, what, before, after, gain, interval}). A
    tuned study's loss intervals keep their LR selection's allowance (allowance_of)."""
    doc = json.loads(json.dumps(doc))  # a copy
    effects = doc.get("effects") or []
    changes = []
    families = {}
    for i, e in enumerate(effects):
        families.setdefault((e["metric"], e["group"]), []).append(i)
    for (metric, group), idx in families.items():
        rows = [effects[i] for i in idx]
        if metric == SPEED_METRIC and all(OVERLAP_NOTE in (r.get("note") or "") for r in rows):
            judged = [r | {"call": stats.NOT_TIMED} for r in rows]
        else:
            margin = rows[0].get("threshold")
            judged = _judged(rows, margin if margin is not None else math.nan, _alpha(rows),
                             tuned=metric in LOSS_UNITS and bool(doc.get("tuning")))
        for i, new in zip(idx, judged):
            old = effects[i]
            if new["call"] != old["call"]:
                changes.append({"study": doc.get("study"), "what": _name(new, metric), "before": old["call"],
                                "after": new["call"], "gain": new["gain"],
                                "interval": (new.get("adj_low"), new.get("adj_high"))})
            effects[i] = new
    if doc.get("scale"):
        changes += _rejudge_scale(doc)
    if (doc.get("tuning") or {}).get("comparison"):
        _rejudge_comparison(doc)
    return doc, changes


def _rejudge_comparison(doc: dict) -> None:
    """A tuned study's comparison with its shared LR: each row's tuned side from its rejudged loss effect and the
    flag from the two calls. The shared side stays as its report judged it: the file keeps only its adjusted
    interval, from which no later rule can judge it again exactly (its raw interval is not recorded)."""
    judged = {(e["flip"], e["direction"], e["group"]): e for e in doc["effects"] if e["metric"] in LOSS_UNITS}
    for row in doc["tuning"]["comparison"]:
        e = judged.get((row["flip"], row["direction"], row["group"]))
        if e is not None:
            row |= {k: e[k] for k in ("gain", "adj_low", "adj_high", "call")}
            row["confounded"] = bool(row.get("shared_n_pairs") and row["call"] != row["shared_call"])


def _name(e: dict, metric: str) -> str:
    where = f" [{e['group']}]" if e.get("group") else ""
    return f"{e['flip']} {e['direction']}{where}" + (" (tokens/s)" if metric == SPEED_METRIC else "")


def _rejudge_scale(doc: dict) -> list[dict]:
    """A size ladder's by-size calls (from the rejudged loss effects) and its trends (slopes judged again)."""
    from anatomy_cli.report import scale

    sc = doc["scale"]
    judged = {(e["flip"], e["direction"], e["group"]): e for e in doc["effects"] if e["metric"] in LOSS_UNITS}
    for row in sc.get("effects") or []:  # each size's row repeats its effect's interval and call
        e = judged.get((row["flip"], row["direction"], f"size {row['size']}"))
        if e is not None:
            row |= {k: e[k] for k in ("adj_low", "adj_high", "call")}
    changes = []
    by_series: dict[str, list[dict]] = {}
    for t in sc.get("trends") or []:
        by_series.setdefault(t["series"], []).append(t)
    for series, trends in by_series.items():
        sizes = [s for s in sc.get("sizes") or [] if s["series"] == series]
        logs = [math.log10(s["non_embedding_params"]) for s in sizes if s.get("non_embedding_params")]
        span = max(logs) - min(logs) if logs else 0.0
        tested = [t for t in trends if t["sizes"] >= 2 and t["n_seeds"] >= 2]
        alpha = _alpha([{"adj_level": t.get("adj_level"), "family": len(tested)} for t in tested])
        fresh = stats.judge([paired_of({}, t["n_seeds"], t["slope"], t["slope_low"], t["slope_high"])
                             for t in tested], math.nan, alpha)
        for t, new in zip(tested, fresh):
            t |= {"slope_adj_low": new["adj_low"], "slope_adj_high": new["adj_high"], "adj_level": new["adj_level"],
                  "p_holm": new["p_holm"]}
        for t in trends:
            if t["sizes"] < 2 or t["n_seeds"] < stats.MIN_PAIRS:
                continue  # its call names a cause or too few seeds: no interval decides it
            size_calls = [r["call"] for r in sc.get("effects") or []
                          if r["series"] == series and r["flip"] == t["flip"] and r["direction"] == t["direction"]]
            margin = t.get("threshold")
            call = scale.scale_call(size_calls, t["n_seeds"], t["sizes"], (t["slope_adj_low"], t["slope_adj_high"]),
                                    (t["fit_smallest"], t["fit_largest"]), math.nan if margin is None else margin,
                                    span)
            if call != t["call"]:
                changes.append({"study": doc.get("study"), "what": f"{t['flip']} {t['direction']} across sizes",
                                "before": t["call"], "after": call, "gain": t["slope"],
                                "interval": (t["slope_adj_low"], t["slope_adj_high"])})
            t["call"] = call
    return changes


def table(changes: list[dict]) -> list[str]:
    """The markdown table of the calls that changed."""
    out = ["| study | effect | before | after | gain | interval |", "|---|---|---|---|---|---|"]
    for c in changes:
        low, high = c["interval"]
        shown = "" if low is None or high is None else f"[{low:+.3f}, {high:+.3f}]"
        out.append(f"| {c['study']} | {c['what']} | {c['before']} | {c['after']} | {c['gain']:+.3f} | {shown} |")
    return out


def spec_of(path: Path, doc: dict) -> Path:
    """The spec a results file's study was run from: experiments/STUDY.toml beside its results folder."""
    spec = Path(path).resolve().parent.parent / f"{doc.get('study')}.toml"
    if not spec.is_file():
        raise InputError(f"{path}: its study's spec {spec} is not there, and converting it to bits per byte needs "
                         f"its corpus and validation windows")
    return spec


def rejudge_files(paths: list[Path], check: bool = False) -> list[dict]:
    """`anatomy rejudge FILE ... [--check]`: each results file judged again (rewritten unless `check`), every file
    read before any is written; the calls that changed (table() prints them). A file that cannot be read raises
    ResultsError (one line)."""
    from anatomy_cli.store.runs import atomic_write_text

    docs = [(path, load(path)) for path in paths]
    for path, doc in docs:  # every file judgeable before any is judged or written
        check_judgeable(path, doc)
    changed = []
    for path, doc in docs:
        before = doc
        if results_bpb.in_nats(doc):  # written before bits per byte was the unit: converted first, exactly
            doc = results_bpb.in_bits_per_byte(doc, results_bpb.factor_of(spec_of(path, doc)))
        new, changes = rejudge(doc)
        if doc is not before:  # the calls the conversion's margin moved, against the file as it was
            changes = results_bpb.moved_calls(before, new)
        changed += changes
        if not check and new != before:
            atomic_write_text(path, json.dumps(new, indent=1, allow_nan=False) + "\n")
    return changed


if __name__ == "__main__":  # `python -m anatomy_cli.report.rejudge` is no command: say which one is (usage: exit 2)
    import sys

    sys.stderr.write("error: judge results files again with `anatomy rejudge FILE ... [--check]`\n")
    sys.exit(2)
