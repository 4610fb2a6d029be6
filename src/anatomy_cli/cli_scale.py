"""`anatomy scale-plan SPEC`: a size ladder's plan per size before anything trains (ladder.py), also
printed by `ablate --dry-run` for a spec with [[sizes]]."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli_app import JsonOut, app, console, handle_errors
from .cli_sweep import fmt_seconds, sweep_workers
from .config import MAX_SEEDS


@app.command("scale-plan")
@handle_errors
def scale_plan(
    spec: Annotated[Path, typer.Argument(help="Ablation spec (TOML), usually with [[sizes]].")],
    seeds: Annotated[Optional[int], typer.Option(min=1, max=MAX_SEEDS, help="Number of seeds (overrides the spec).")] = None,
    workers: Annotated[Optional[int], typer.Option(min=1, help="Parallel processes the estimate packs runs onto (default: as ablate).")] = None,
    vocab: Annotated[Optional[int], typer.Option(min=1, help="Assume this vocabulary instead of reading the corpus (plan before preparing it; its tokens per parameter are then unknown).")] = None,
    estimate: Annotated[bool, typer.Option("--estimate/--no-estimate", help="Estimate times from step times measured on this machine (a short calibration per size, cached).")] = True,
    json_out: JsonOut = False,
):
    """Per size: parameters, tokens and FLOPs per run, estimated time here, corpus tokens per parameter.

    Warns when a size would overfit its corpus (a run makes more than 10 epochs over it) or take
    longer than a day; the spec's budget rule (same-steps or tokens-per-param) sets each size's steps.
    """
    from .sweep import expand, load_spec

    s = load_spec(spec)
    plan = expand(s, None, seeds)
    payload, text = size_report(plan, workers, vocab, estimate)
    if json_out:
        console.print_json(json.dumps({"spec": s.name, "budget": s.budget, "tokens_per_param": s.tokens_per_param,
                                       **payload}))
        return
    console.print(f"{s.name}: budget {s.budget}" + (f" ({s.tokens_per_param:g} tokens per non-embedding parameter)"
                                                    if s.tokens_per_param else ""), highlight=False, markup=False)
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def size_report(plan, workers: int | None, vocab: int | None, estimate: bool = True) -> tuple[dict, str]:
    """(the JSON payload, the plain-text table fitted to the terminal) of a plan's sizes."""
    from . import ladder
    from .calibrate import busy, plan_seconds
    from .sweep import corpus_facts, default_workers, plan_estimate
    from .textable import table, width, wrap

    sources = dict.fromkeys(p.config.data.source for p in plan)
    facts = {src: {"vocab": vocab, "train_tokens": None} for src in sources} if vocab else corpus_facts(plan)
    vocabs = {src: f["vocab"] for src, f in facts.items()}
    why_not = None if estimate else "--no-estimate"
    n_workers = workers or 1
    if why_not is None:
        try:
            n_workers = workers or sweep_workers(plan, vocabs, default_workers(len(plan)))
        except ValueError as err:  # a device this machine does not have
            why_not = str(err)
    est = None
    if why_not is None:
        per_run, startup = plan_estimate(plan, n_workers, vocabs)
        est = ladder.Estimate(per_run, startup, n_workers)
    rows = ladder.size_rows(plan, facts, est)
    total = plan_seconds(list(est.per_run.values()), n_workers, est.startup_s) if est else None
    load = busy()
    payload = {"workers": n_workers, "sizes": rows, "total_s": total, "no_estimate": why_not,
               "busy": load is not None, "rule": {"max_epochs": ladder.MAX_EPOCHS, "day_s": ladder.DAY_S}}
    active = any(r["active_params"] != r["params"] for r in rows)
    heads = ["size", "runs", "params", "non-emb.", *(["active"] if active else []), "steps", "tokens/run",
             "FLOPs/run", "est.", "corpus tok/param", "epochs", "warning"]
    c = ladder.count
    cells = [[r["size"] or "(base)", str(r["runs"]), c(r["params"]), c(r["non_embedding_params"]),
              *([c(r["active_params"])] if active else []), f"{r['steps']:,}", c(r["tokens"]), c(r["flops"]),
              "-" if r["est_s"] is None else fmt_seconds(r["est_s"]),
              "?" if r["corpus_tokens_per_param"] is None else f"{r['corpus_tokens_per_param']:.3g}",
              "?" if r["epochs"] is None else f"{r['epochs']:.2g}",
              ", ".join(w.split(":")[0] for w in r["warnings"]) or "-"] for r in rows]
    cols = width()
    body = table(heads, cells, cols, fit=[("drop", "runs"), ("drop", "corpus tok/param"), ("drop", "params"),
                                          ("drop", "FLOPs/run")],
                 right={h for h in heads if h not in ("size", "warning")})
    busy_note = f"; the machine is busy now (load {load[0]:.1f} on {load[1]} cores): expect longer" if load else ""
    when = (f"est. {fmt_seconds(total)} for {len(plan)} runs on {n_workers} worker{'s' * (n_workers > 1)}, from step "
            f"times measured on this machine{busy_note}") if total is not None else f"no time estimate ({why_not})"
    notes = [f"{r['size'] or '(base)'}: {w}" for r in rows for w in r["warnings"]]
    notes += [when, f"Warnings: overfit risk when a run makes more than {ladder.MAX_EPOCHS} epochs over its "
                   f"corpus' training split; a size whose runs take more than a day. Params, FLOPs: each size's "
                   f"first config (its reference end); FLOPs: training only."]
    return payload, "\n".join([body, ""] + [wrap(n, cols) for n in notes])
