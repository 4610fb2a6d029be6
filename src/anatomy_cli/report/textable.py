"""Plain-text tables that fit a terminal width (no rich, no torch): for the verdict and the
component table, which must read in an 80- or 60-column terminal and in a pipe.

A table that is too wide is fitted step by step, in the order the caller gives: ("drop", column)
removes a column, ("cut", column, min_width) shortens a column's cells with an ellipsis. Columns
are separated by two spaces; numbers (`right`) align right.
"""

from __future__ import annotations

import shutil
import textwrap

GAP = "  "
ELLIPSIS = "…"
IDENTIFYING = frozenset({"name", "run id", "run_id", "role", "label", "call", "component", "size"})


def width() -> int:
    """The terminal's width (COLUMNS first, as the shell sets it; 80 in a pipe)."""
    return shutil.get_terminal_size((80, 24)).columns


def table(headers: list[str], rows: list[list[str]], max_width: int | None = None,
          fit: list[tuple] = (), right: set[str] = frozenset()) -> str:
    cols = list(headers)
    widths = {h: max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)}
    # the identifying columns are cut last, whatever the caller's order: the descriptive ones go first (#30)
    fit = sorted(fit, key=lambda step: step[0] == "cut" and step[1] in IDENTIFYING)
    for step in fit:
        if max_width is None or _total(widths, cols) <= max_width:
            break
        if step[0] == "drop" and step[1] in cols and len(cols) > 1:
            cols.remove(step[1])
        elif step[0] == "cut" and step[1] in cols:
            floor = max(step[2], max(len(w) for w in step[1].split()))  # a header wraps, never cut
            widths[step[1]] = max(floor, widths[step[1]] - (_total(widths, cols) - max_width))
    index = {h: i for i, h in enumerate(headers)}
    heads = [textwrap.wrap(h, widths[h]) or [""] for h in cols]
    lines = [[(parts[k] if k < len(parts) else "") for parts in heads] for k in range(max(map(len, heads)))]
    lines += [["-" * widths[h] for h in cols]]
    lines += [[r[index[h]] for h in cols] for r in rows]
    return "\n".join(GAP.join(_cell(v, widths[h], h in right) for v, h in zip(line, cols)).rstrip()
                     for line in lines)


def wrap(text: str, max_width: int | None) -> str:
    """A paragraph wrapped to the width (unchanged without one)."""
    return text if max_width is None else textwrap.fill(text, max(20, max_width))


def _total(widths: dict[str, int], cols: list[str]) -> int:
    return sum(widths[c] for c in cols) + len(GAP) * (len(cols) - 1)


def _cell(value: str, w: int, right: bool) -> str:
    if len(value) > w:
        value = value[: max(0, w - 1)] + ELLIPSIS
    return value.rjust(w) if right else value.ljust(w)
