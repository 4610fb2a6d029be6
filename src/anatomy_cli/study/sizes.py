"""A size ladder's plan per size before anything trains (scale-plan, ablate --dry-run): parameters,
tokens, FLOPs, the time each size would take here, corpus tokens per parameter, and the warnings.

  size_plan  the payload per size (sweep.ladder's rows), with the workers and time they assume
"""

from __future__ import annotations

from anatomy_cli.sweep import ladder
from anatomy_cli.sweep.calibrate import busy, plan_seconds
from anatomy_cli.sweep.plan import corpus_facts, plan_estimate, plan_workers


def size_plan(plan, workers: int | None, vocab: int | None, estimate: bool = True) -> dict:
    """{workers, sizes (one row per size), total_s, no_estimate (why no time: None when timed), busy,
    load (the load average and cores when busy, else None), rule} of a plan. vocab: assume this
    vocabulary instead of reading the corpora; estimate False: no calibration, no times."""
    sources = dict.fromkeys(p.config.data.corpus_key for p in plan)
    facts = {src: {"vocab": vocab, "train_tokens": None} for src in sources} if vocab else corpus_facts(plan)
    vocabs = {src: f["vocab"] for src, f in facts.items()}
    why_not = None if estimate else "--no-estimate"
    n_workers = workers or 1
    if why_not is None:
        try:
            n_workers = workers or plan_workers(plan, vocabs)
        except ValueError as err:  # a device this machine does not have
            why_not = str(err)
    est = None
    if why_not is None:
        per_run, startup = plan_estimate(plan, n_workers, vocabs)
        est = ladder.Estimate(per_run, startup, n_workers)
    rows = ladder.size_rows(plan, facts, est)
    total = plan_seconds(list(est.per_run.values()), n_workers, est.startup_s) if est else None
    load = busy()
    return {"workers": n_workers, "sizes": rows, "total_s": total, "no_estimate": why_not, "busy": load is not None,
            "rule": {"max_epochs": ladder.MAX_EPOCHS, "day_s": ladder.DAY_S}, "load": load}
