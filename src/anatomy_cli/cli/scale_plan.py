"""`anatomy scale-plan SPEC`: a size ladder's plan per size before anything trains (study/sizes.py over
sweep/ladder.py), also printed by `ablate --dry-run` for a spec with [[sizes]]."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import JsonOut, app, console, handle_errors
from anatomy_cli.cli.render import size_report
from anatomy_cli.spec.config import MAX_SEEDS


@app.command("scale-plan")
@handle_errors
def scale_plan(
    spec: Annotated[Path, typer.Argument(help="Ablation spec (TOML), usually with \\[\\[sizes]].")],
    seeds: Annotated[Optional[int], typer.Option(
        min=1, max=MAX_SEEDS, help="Number of seeds (overrides the spec).")] = None,
    workers: Annotated[Optional[int], typer.Option(
        min=1, help="Parallel processes the estimate packs runs onto (default: as ablate).")] = None,
    vocab: Annotated[Optional[int], typer.Option(
        min=1, help="Assume this vocabulary instead of reading the corpus (plan before preparing it; its tokens per "
        "parameter are then unknown).")] = None,
    estimate: Annotated[bool, typer.Option(
        "--estimate/--no-estimate", help="Estimate times from step times measured on this machine (a short "
        "calibration per size, cached).")] = True,
    json_out: JsonOut = False,
):
    """Per size: parameters, tokens and FLOPs per run, estimated time here, corpus tokens per parameter.

    Warns when a size would overfit its corpus (a run makes more than 10 epochs over it) or take
    longer than a day, repeats another size's parameter count, or trains 0 steps; and when the ladder
    can form no trend across sizes at all (one size, one parameter count, no size that trains). The
    spec's budget rule (same-steps or tokens-per-param) sets each size's steps.
    """
    from anatomy_cli.spec.knobs import from_alias
    from anatomy_cli.sweep.ladder import trend_warnings
    from anatomy_cli.sweep.plan import load_plan

    s, plan = load_plan(spec, [from_alias("--seeds", str(seeds))] if seeds is not None else [])
    payload, text = size_report(plan, workers, vocab, estimate)
    ladder_warnings = trend_warnings(payload["sizes"])
    if json_out:
        console.print_json(json.dumps({"spec": s.name, "budget": s.budget, "tokens_per_param": s.tokens_per_param,
                                       **payload, "warnings": ladder_warnings}))
        return
    console.print(f"{s.name}: budget {s.budget}" + (f" ({s.tokens_per_param:g} tokens per non-embedding parameter)"
                                                    if s.tokens_per_param else ""), highlight=False, markup=False)
    console.print(text, highlight=False, markup=False, soft_wrap=True)
    for line in ladder_warnings:  # last, where the terminal leaves it
        console.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)
