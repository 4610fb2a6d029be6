"""Which calls hold across tokenizers (no torch): a study that names several (`tokenizers = [...]`) runs its
design at each, each tokenizer its own family paired within itself (effects.groups: data.tokenizer is one of a
group's settings, so runs of two tokenizers never share a group); this module sets each family's calls side by
side.

  tokenizer_of  {group label: the tokenizer its runs trained with} of a runs frame
  across        one row per flip and direction: the gain and call at each tokenizer, and what the calls say
                across them (ACROSS: holds, moves or open)
  lines         those rows as the report's lines, one per component

A call holds when every tokenizer gives the same decided one ("nothing" is a call too: negligible at each); it
moves when two tokenizers give two different decided calls (helps at one, negligible or hurts at another); it is
open otherwise (a tokenizer whose call is undecided: more seeds would tell). Each family is judged at the study's
margin in bits per byte, the one unit in which a character model and a BPE model sit on one axis, so "the same
call" compares like with like; a call that moves says a part's worth depends on the tokenizer (at this size and
budget).
"""

from __future__ import annotations

import json

import pandas as pd

from anatomy_cli.report import effects as effects_mod
from anatomy_cli.report import stats

TOKENIZER_KEY = "data.tokenizer"
HOLDS, MOVES, OPEN = "holds", "moves", "open"
ACROSS = (HOLDS, MOVES, OPEN)
DECIDED = (stats.HELPS, stats.HURTS, stats.NEGLIGIBLE)  # calls that claim something: two that differ disagree
HELD = (*DECIDED, stats.SMALL)  # calls that hold when every tokenizer gives the same one


def tokenizer_of(runs: pd.DataFrame) -> dict[str, str]:
    """{group label (effects.groups'): the tokenizer of its runs}; a group of runs without the setting (written
    before tokenizers) trained on characters."""
    out = {}
    for group, members in effects_mod.groups(runs[runs["role"] != ""]):
        names = {json.loads(s).get(TOKENIZER_KEY, "char") for s in members["settings"]}
        if len(names) == 1:  # one always: data.tokenizer is a setting of the group (never switched: sweep.plan)
            out[group] = names.pop()
    return out


def across(loss: pd.DataFrame, groups: dict[str, str]) -> list[dict]:
    """Rows {flip, direction, tokenizers, calls, gains, intervals, across} where the loss effects (one family per
    group) span two tokenizers or more; [] for a study of one. A tokenizer with several groups (sizes, axes) keys
    its calls by group label instead, so no two families are folded into one."""
    if loss.empty or len(set(groups.values())) < 2:
        return []
    per_tok = {t: [g for g, v in groups.items() if v == t] for t in dict.fromkeys(groups.values())}
    label = {g: (t if len(per_tok[t]) == 1 else g) for t, gs in per_tok.items() for g in gs}
    rows = []
    for (flip, direction), sub in loss.groupby(["flip", "direction"], sort=False):
        sub = sub[sub["group"].isin(list(label))]
        if sub["group"].nunique() < 2:
            continue
        cells = {label[r["group"]]: r for _, r in sub.iterrows()}
        calls = {k: r["call"] for k, r in cells.items()}
        rows.append({"flip": flip, "direction": direction, "tokenizers": list(cells), "calls": calls,
                     "gains": {k: _num(r["gain"]) for k, r in cells.items()},
                     "intervals": {k: [_num(r["adj_low"]), _num(r["adj_high"])] for k, r in cells.items()},
                     "across": verdict(list(calls.values()))})
    return rows


def verdict(calls: list[str]) -> str:
    """What one component's calls at several tokenizers say together: HOLDS, MOVES or OPEN (module docstring)."""
    if len(set(calls)) == 1 and calls[0] in HELD:
        return HOLDS
    return MOVES if len({c for c in calls if c in DECIDED}) > 1 else OPEN


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else round(float(x), 6)


def lines(rows: list[dict], bold: bool = True) -> list[str]:
    """'**rope**: added holds (helps +0.301 at char, helps +0.254 at bpe:512)', one line per component."""
    from anatomy_cli.spec.roles import VERB

    out: dict[str, list[str]] = {}
    for r in rows:
        cells = ", ".join(f"{r['calls'][t]} {_signed(r['gains'][t])} at {t}" for t in r["tokenizers"])
        out.setdefault(r["flip"], []).append(f"{VERB[r['direction']]} {r['across']} ({cells})")
    return [f"{'**' * bold}{flip}{'**' * bold}: " + "; ".join(said) for flip, said in out.items()]


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.3f}"
