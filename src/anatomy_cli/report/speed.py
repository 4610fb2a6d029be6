"""Speed effects from a timing pass's record (sweep/timing.py writes it): the analysis half (no torch).

  timing_effects   timing record -> effect rows (stats.paired) for tokens_per_s, as gains
  noise            the reference end's round-to-round spread of tokens/s, in %
  summary_line     one line: rounds, steps, what was timed

A component's speed effect is paired within a round, where both configs met the same machine state:
gain_r = 100 * (tokens/s with the component / tokens/s without it - 1), judged over rounds by the
report's one rule (stats.py) against the fixed margin stats.SPEED_MARGIN; the reference end's
round-to-round spread is reported beside it as the effects' noise, never used as the margin.

The record (store/records.py's TimingRecord, read by records.read_timing): steps, warmup, rounds, threads,
ends [reference name, all-on name], configs [{slug, role, flip, group}], rounds_data [{slug: tokens/s}]. A
record that does not fit it is a RunError naming the field: the report stops there rather than go on
without the timing pass it was asked to read (rerun `anatomy ablate --time` to write a new one).
"""

from __future__ import annotations

import math

import numpy as np

from anatomy_cli.report import stats
from anatomy_cli.spec.roles import ADD_ONE, ALL_ON, END_OF, REFERENCE, REMOVE_ONE, shown

METRIC = "tokens_per_s"


def timing_effects(record: dict) -> list[dict]:
    """Speed effect rows of a timing record, each variant against its end paired within rounds, as a
    gain: 100 * (tokens/s with the component / without - 1) %, positive = faster (stats.gain)."""
    by_role = {(c.get("group", ""), c["role"], c["flip"]): c["slug"] for c in record["configs"]}
    ends = record.get("ends") or [REFERENCE, ALL_ON]
    ends = [shown(e) for e in ends]
    rows = []
    for (group, role, flip), slug in by_role.items():
        if role not in (ADD_ONE, REMOVE_ONE):
            continue
        ref = by_role.get((group, END_OF[role], None))
        if ref is None:
            continue
        pairs = np.array([(r[ref], r[slug]) for r in record["rounds_data"] if slug in r and ref in r and r[ref] > 0
                          and r[slug] > 0], dtype=float).reshape(-1, 2)
        gains = stats.gain(pairs[:, 0], pairs[:, 1], role == ADD_ONE, relative=True, higher_is_better=True)
        gains = gains[np.isfinite(gains)]
        rows.append({"metric": METRIC, "flip": flip, "direction": role, "against": f"{ends[role == 'remove-one']} end",
                     "group": group, "excluded": len(record["rounds_data"]) - len(gains), "unit": "%",
                     "note": (f"timing pass: {len(gains)} rounds x {record['steps']} steps, "
                              f"{record['threads']} thread(s), paired within rounds"), **stats.paired(gains)})
    return rows


def noise(record: dict) -> float:
    """The speed effects' noise: the reference end's round-to-round sd of tokens/s in percent of its
    mean (as the seed-to-seed sd is for loss), shown beside the margin, never used as it; NaN with
    fewer than two rounds."""
    ref = next((c["slug"] for c in record["configs"] if c["role"] == REFERENCE),
               next((c["slug"] for c in record["configs"] if c["role"] == ALL_ON), None))
    tps = np.array([r[ref] for r in record["rounds_data"] if ref in r], dtype=float)
    return float(100.0 * tps.std(ddof=1) / tps.mean()) if len(tps) > 1 else math.nan


def summary_line(record: dict) -> str:
    tps = [v for r in record["rounds_data"] for v in r.values()]
    return (f"timing pass: {len(record['configs'])} configs x {len(record['rounds_data'])} rounds x "
            f"{record['steps']} timed steps (after {record['warmup']} untimed), one config at a time in one "
            f"worker process with {record['threads']} thread(s); tokens/s from {min(tps):,.0f} to {max(tps):,.0f}"
            if tps else "timing pass: no rounds")
