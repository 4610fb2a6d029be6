"""The parts commands registered on the main app: `anatomy components` (the component table) and
`anatomy components check FILE` (the battery a part passes, exams/parts_check.py).

`components` is a command group whose bare form is the table: `anatomy components [SPEC] [--json]
[--wide]` runs its `list` command, as it did before `check` joined it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import EXIT_FAILED, Group, JsonOut, Plugins, app, console, handle_errors, load_parts
from anatomy_cli.spec import components, reference
from anatomy_cli.spec import parts as registry
from anatomy_cli.sweep.plan import load_plan, spec_table


class TableByDefault(Group):
    """A group whose bare invocation (or one whose first word is no subcommand) runs `list`."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


parts_app = typer.Typer(cls=TableByDefault, name="components", no_args_is_help=False,
                        help="The component table (bare: `anatomy components [SPEC] [--json] [--wide]`, the `list` "
                        "command) and `check FILE`: the battery a plugin's part passes before a study trusts it.")
app.add_typer(parts_app)


@parts_app.command("list")
@handle_errors
def components_cmd(
    spec: Annotated[Optional[Path], typer.Argument(help="Also list this spec's own \\[components.NAME].")] = None,
    json_out: JsonOut = False,
    wide: Annotated[bool, typer.Option("--wide", help="Every column in full, whatever the terminal's width.")] = False,
    plugin: Plugins = None,
):
    """The component table: name, off -> on settings, what it changes in parameters, source."""
    from anatomy_cli.report.textable import table, width, wrap

    load_parts(plugin)
    table_ = {c.name: c for c in components.rows()}
    if spec is not None:  # validated exactly as ablate validates it, plan included
        table_ = spec_table(load_plan(spec)[0])
    rows = []
    for c in table_.values():
        change = {end: param_change(c, end == "llama") for end in ("2017", "llama")}
        rows.append(components.record(c) | {"off_text": c.describe("off"), "on_text": c.describe("on")}
                    | {f"params_from_{end}": d and d[0] for end, d in change.items()}
                    | {f"active_from_{end}": d and d[1] for end, d in change.items()} | plugin_facts(c))
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


def param_change(c, end_on: bool) -> tuple[int, int] | None:
    """reference.param_change: from the formulas for anatomy's rows; for a plugin's part the total is
    counted from the modules built (the formula is what the battery checks against it)."""
    part = registry.REGISTRY.get(c.name)
    if c.origin == "built-in" or part is None or not part.plugin:
        return reference.param_change(c, end_on)
    from anatomy_cli.exams.parts_check import counted_change

    return counted_change(c, end_on)


def plugin_facts(c) -> dict:
    """A plugin part's slot, file hash and default options, for --json ({} for anatomy's rows)."""
    part = registry.REGISTRY.get(c.name)
    if part is None or not part.plugin:
        return {}
    opts = registry.options(part, {})
    return {"slot": part.slot, "sha256": part.sha256, "options": opts.model_dump(mode="json") if opts else None}


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


# ----------------------------------------------------------------------------------- check


@parts_app.command("check")
@handle_errors
def check_cmd(
    file: Annotated[Path, typer.Argument(help="A plugin file of parts (decorated with @part, "
                                              "anatomy_cli.model.parts).", show_default=False)],
    part: Annotated[Optional[str], typer.Option("--part", help="Only this part of the file.")] = None,
    json_out: JsonOut = False,
    plugin: Plugins = None,
):
    """Check a plugin's parts with the battery anatomy's own parts pass; exit 1 when a check fails.

    On the CPU at toy sizes, at both ends of a study where the part fits (2017 and LLaMA): shapes,
    causality (fp64), cached decode == full forward, determinism, declared vs counted parameters,
    gradients, bf16, stacked == alone. Each failure is shown with its first failing case.
    """
    from anatomy_cli.exams.parts_check import check_file

    load_parts(plugin)
    done = check_file(file, part)
    if json_out:
        console.print_json(json.dumps({name: [r.__dict__ for r in results] for name, results in done.results.items()}
                                      | {"file": str(file)}))
    else:
        console.print(check_text(done), highlight=False, markup=False, soft_wrap=True)
    if done.failures:
        raise typer.Exit(EXIT_FAILED)


def check_text(done) -> str:
    """Each part's table of checks by end, its notes, then its failures with their first failing case."""
    from anatomy_cli.exams.parts_check import CHECKS, ENDS, FAIL, NOTE
    from anatomy_cli.report.textable import table

    out = []
    for name, results in done.results.items():
        p = done.parts[name]
        out.append(f"{name} ({p.slot}, from {p.origin}, sha256 {p.sha256[:12]})")
        by = {(r.check, r.end): r for r in results}
        ends = [e for e in ENDS if any(r.end == e for r in results if r.check != "fits")]
        out.append(table(["check", *ends], [[c, *(by[(c, e)].status if (c, e) in by else "-" for e in ends)]
                                            for c in CHECKS]))
        out += [f"  {r.status}: {r.check}{f' ({r.end})' if r.end else ''}: {r.detail}" for r in results
                if r.status in (NOTE, FAIL) and r.detail and not r.detail.startswith("not run")]
        bad = [r for r in results if r.status == FAIL]
        out.append(f"{name}: {len(bad)} check{'s' * (len(bad) != 1)} failed" if bad else
                   f"{name}: passes every check at {' and '.join(ends) or 'no end'}")
        out.append("")
    return "\n".join(out).rstrip()
