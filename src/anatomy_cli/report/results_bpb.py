"""A results file written in nats per character, in bits per byte, today's unit (no torch at import).

Every loss of a study on one corpus and one set of validation windows is turned into bits per byte by one
constant: bpb = nats per token x val_tokens / (ln 2 x val_bytes), where val_tokens and val_bytes are the fixed
validation windows' targets and the UTF-8 bytes they stand for (data.batches.eval_counts). So a results file
written before bits per byte was the unit is converted exactly, without retraining: each loss, gain, interval,
noise and slope multiplied by the constant of the windows its study evaluated on, read again from its spec and
its corpus; then every call is judged again at today's margin (rejudge.py), which is a number of bits per byte.

  factor_of        the constant of a study: from its spec (one corpus and one set of eval windows, else refused)
  in_bits_per_byte a results document in nats/char -> the same in bits per byte, its calls not yet re-judged
  in_nats          whether a results document is one of them

What is not converted: a tuned study's selection losses (`tuning.arms`: best_loss, sensitivity) stay in nats
per token as tune.json holds them and its table says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from anatomy_cli.report import stats
from anatomy_cli.report.lr_comparison import NOT_TUNED
from anatomy_cli.report.results_file import LOSS_UNITS, ResultsError, unit_of

NATS, BPB = "best_val_loss", "best_val_bpb"
SCALED = ("gain", "adj_low", "adj_high", "raw_low", "raw_high", "mde", "noise")  # an effect's, in its unit
SCALE_EFFECT = ("gain", "adj_low", "adj_high")
TREND = ("slope", "slope_adj_low", "slope_adj_high", "slope_low", "slope_high", "fit_smallest", "fit_largest",
         "change")
COMPARISON = ("gain", "adj_low", "adj_high", "shared_gain", "shared_low", "shared_high")


def in_nats(doc: dict) -> bool:
    """Whether a results document's losses are in nats per character (results_file.unit_of)."""
    return unit_of(doc) == LOSS_UNITS[NATS]


def factor_of(spec: Path) -> tuple[int, int]:
    """(val_tokens, val_bytes) of a study's validation windows (bits per byte = nats x tokens / (ln 2 x bytes)): its
    plan's one (corpus, tokenizer, ctx_len, batch, eval batches) counted as training counts it; a study of several
    is refused (each would need its own)."""
    from anatomy_cli.data.batches import eval_counts
    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.sweep.plan import load_plan

    _, plan = load_plan(Path(spec))
    kinds = {(p.config.data.source, p.config.data.val_frac, p.config.data.tokenizer, p.config.model.ctx_len,
              p.config.train.batch_size, p.config.train.eval_batches) for p in plan}
    if len(kinds) != 1:
        raise ResultsError(f"{spec}: its runs evaluate on {len(kinds)} sets of windows; a file of it cannot be "
                           f"converted with one constant")
    source, val_frac, tokenizer, ctx, batch, batches = kinds.pop()
    corpus = load_corpus(source, val_frac, ctx, tokenizer=tokenizer)
    return eval_counts(corpus, ctx, batch, batches)


def _times(row: dict, keys: tuple[str, ...], k: float) -> None:
    for key in keys:
        if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool):
            row[key] = _round(row[key] * k)


def _round(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def in_bits_per_byte(doc: dict, counts: tuple[int, int], margin: float = stats.DEFAULT_MARGIN) -> dict:
    """`doc` (a results document in nats per token) with every loss number times k = counts[0] / (ln 2 x
    counts[1]) (factor_of's val tokens and bytes, which it records as "per_byte"), its loss
    effects' metric best_val_bpb, and its margin today's: the default in bits per byte where the study used the
    default, the given margin times k where it gave one. The calls are judged again by rejudge.rejudge (and a
    tuned comparison's here, from its scaled intervals: stats.call at the margin)."""
    k = counts[0] / (math.log(2) * counts[1])
    doc = {key: value for name, v in json.loads(json.dumps(doc)).items() if name != "unit"  # the unit after the study
           for key, value in ([(name, v), ("unit", LOSS_UNITS[BPB])] if name == "study" else [(name, v)])}
    doc["per_byte"] = {"val_tokens": counts[0], "val_bytes": counts[1]}
    tuned = bool(doc.get("tuning"))
    for e in doc.get("effects") or []:
        if e.get("metric") != NATS:
            continue
        _times(e, SCALED, k)
        e["metric"] = BPB
        given = e.get("threshold_basis") not in (None, stats.DEFAULT) and isinstance(e.get("threshold"), float)
        e["threshold"] = _round(e["threshold"] * k) if given else margin
        if tuned:  # its interval holds the LR selection's allowance, which the file does not record: kept, scaled
            e["call"] = _call(e, "n_pairs", "gain", "adj_low", "adj_high", e["threshold"]) or e["call"]
    for role in (doc.get("ends") or {}).values():
        _times(role, ("mean", "sd", "final"), k)
    _times(doc.get("budget") or {}, ("reference", "all-on"), k)
    for row in doc.get("eval_gains") or []:
        row["gain"] = [None if g is None else _round(g * k) for g in row.get("gain") or []]
    scale = doc.get("scale") or {}
    for row in scale.get("effects") or []:
        _times(row, SCALE_EFFECT, k)
    for t in scale.get("trends") or []:
        _times(t, TREND, k)
        given = isinstance(t.get("threshold"), float) and not math.isclose(t["threshold"], stats.DEFAULT_MARGIN)
        t["threshold"] = _round(t["threshold"] * k) if given else margin
    for row in (doc.get("tuning") or {}).get("comparison") or []:
        _times(row, COMPARISON, k)
        row["call"] = _call(row, "n_pairs", "gain", "adj_low", "adj_high", margin) or row["call"]
        row["shared_call"] = _call(row, "shared_n_pairs", "shared_gain", "shared_low", "shared_high",
                                   margin) or row["shared_call"]
        row["confounded"] = bool(row["call"] != NOT_TUNED and row["shared_n_pairs"] and
                                 row["call"] != row["shared_call"])
    return doc


def _call(row: dict, n: str, gain: str, low: str, high: str, margin: float) -> str | None:
    """A comparison row's call at `margin` from its (scaled) interval; None where it has none to judge."""
    values = [row.get(k) for k in (gain, low, high)]
    if not row.get(n) or any(v is None for v in values):
        return None
    return stats.call(int(row[n]), *values, margin)


def moved_calls(old: dict, new: dict) -> list[dict]:
    """The calls of `new` (a converted, re-judged document) that differ from `old`'s: its loss and speed effects,
    its trends and a tuned study's comparison, as rejudge.table lists changes."""
    def key(e: dict) -> tuple:
        return ("loss" if e.get("metric") in (NATS, BPB) else e.get("metric"), e["flip"], e["direction"], e["group"])

    out = []
    was = {key(e): e for e in old.get("effects") or []}
    for e in new.get("effects") or []:
        before = was.get(key(e))
        if before is not None and before["call"] != e["call"]:
            out.append(_change(new, f"{e['flip']} {e['direction']}", before["call"], e["call"], e["gain"],
                               (e.get("adj_low"), e.get("adj_high"))))
    pairs = [(t, u) for t, u in zip((old.get("scale") or {}).get("trends") or [],
                                    (new.get("scale") or {}).get("trends") or [])]
    pairs += list(zip((old.get("tuning") or {}).get("comparison") or [], (new.get("tuning") or {}).get("comparison")
                      or []))
    for t, u in pairs:
        if t["call"] != u["call"]:
            low, high = u.get("adj_low", u.get("slope_adj_low")), u.get("adj_high", u.get("slope_adj_high"))
            out.append(_change(new, f"{u['flip']} {u['direction']}", t["call"], u["call"],
                               u.get("gain", u.get("slope")), (low, high)))
    return out


def _change(doc: dict, what: str, before: str, after: str, gain, interval) -> dict:
    return {"study": doc.get("study"), "what": what, "before": before, "after": after, "gain": gain,
            "interval": interval}
