"""The parts commands registered on the main app: `anatomy components` (the component table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import JsonOut, app, console, handle_errors
from anatomy_cli.spec import components, reference
from anatomy_cli.sweep.plan import load_plan, spec_table


@app.command("components")
@handle_errors
def components_cmd(
    spec: Annotated[Optional[Path], typer.Argument(help="Also list this spec's own \\[components.NAME].")] = None,
    json_out: JsonOut = False,
    wide: Annotated[bool, typer.Option("--wide", help="Every column in full, whatever the terminal's width.")] = False,
):
    """The component table: name, off -> on settings, what it changes in parameters, source."""
    from anatomy_cli.report.textable import table, width, wrap

    table_ = dict(components.BY_NAME)
    if spec is not None:  # validated exactly as ablate validates it, plan included
        table_ = spec_table(load_plan(spec)[0])
    rows = []
    for c in table_.values():
        change = {end: reference.param_change(c, end == "llama") for end in ("2017", "llama")}
        rows.append(components.record(c) | {"off_text": c.describe("off"), "on_text": c.describe("on")}
                    | {f"params_from_{end}": d and d[0] for end, d in change.items()}
                    | {f"active_from_{end}": d and d[1] for end, d in change.items()})
    if json_out:
        console.print_json(json.dumps({"reference_size": reference.REFERENCE_SIZE, "components": rows}))
        return
    cells = [[r["name"], change_text(c), _change(r, "2017"), _change(r, "llama"), r["about"], c.source]
             for r, c in zip(rows, table_.values())]
    cols = width() if not wide else None
    text = table(["name", "off -> on", "from 2017", "from LLaMA", "about", "source"], cells, cols,
                 fit=[("drop", "source"), ("drop", "from LLaMA"), ("cut", "off -> on", 32), ("cut", "about", 30),
                      ("cut", "off -> on", 20), ("cut", "about", 20), ("drop", "from 2017"), ("drop", "about")],
                 right={"from 2017", "from LLaMA"})
    head = ("components: parameters each adds at vocab 1719, d 128, 4 layers, 4 heads, ctx 128 "
            "(and per token, where that differs)")
    foot = "" if wide else "anatomy components --wide (or --json) for every column in full"
    console.print("\n".join(filter(None, [wrap(head, cols), text, wrap(foot, cols) if foot else ""])),
                  highlight=False, markup=False, soft_wrap=True)


def _change(row: dict, end: str) -> str:
    """'+1,024', or '+1,626,112 (active +4,096)' for a part a token uses only some of; '-' for none."""
    total, active = row[f"params_from_{end}"], row[f"active_from_{end}"]
    if total is None:
        return "-"
    return f"{total:+,}" + (f" (active {active:+,})" if active != total else "")


def change_text(c) -> str:
    """'norm_type: layernorm -> rmsnorm' (one key), else the settings in full."""
    if len(c.keys) == 1:
        key = c.keys[0]
        off = c.off.get(key, "(base)") if c.off else "(base)"
        off = "''" if off == "" else off  # gdn_pattern's off
        return f"{key.removeprefix('model.')}: {off} -> {c.on[key]}"
    return f"{c.describe('off')} -> {c.describe('on')}"
