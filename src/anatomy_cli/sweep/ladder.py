"""A size ladder's plan, size by size, before anything trains (no torch here): what `anatomy
scale-plan SPEC` and `ablate --dry-run` print for a spec with [[sizes]] (a spec without is one size).

Per size, of its first planned config (the reference end; its other configs differ by a few
percent): parameters (total, non-embedding, and active where a routed FFN makes them differ),
training tokens per run (steps x batch x ctx) and FLOPs per run (ModelConfig.flops_per_token x
tokens, training only), the estimated time of the size's runs packed on the workers (sweep.
plan_estimate: this machine's calibrated step times) and its corpus: training tokens per
non-embedding parameter, and the epochs a run makes over the training split.

Warnings, the rule:
  overfit risk   a run makes more than MAX_EPOCHS epochs over its training split. Measured here:
                 the seed protocol's LLaMA end (0.8M non-embedding parameters) overfits the
                 embedded corpus after 25 epochs (best step 700 of 2000), five-flips' runs at 7.3
                 epochs do not; Muennighoff et al. 2023 (Scaling Data-Constrained Language Models)
                 find repeated tokens worth markedly less than new ones beyond about 4 epochs and
                 almost nothing beyond about 16. A bigger model memorises sooner: check best steps.
  over a day     the size's runs take more than a day on the workers.
  same parameters as S   the size has the non-embedding parameter count of an earlier size S (they
                 differ only in what the count leaves out: ctx_len, the vocabulary): a trend is fitted
                 against that count, so the two give it no slope.
  0 steps        a tokens-per-param budget that comes to under one step (rounded up to 1): the size
                 learns nothing, and its effects are noise.
And one for the ladder (trend_warnings, printed after the plan and in --json's warnings): a ladder
that cannot form any trend across sizes: one size, no size that trains, or a single parameter count
among the sizes that train.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EPOCHS = 10
DAY_S = 86_400.0


@dataclass(frozen=True)
class Estimate:
    """Seconds per run id and one worker's start-up (plan.plan_estimate), and the worker count."""

    per_run: dict[str, float]
    startup_s: float
    workers: int


def size_rows(plan, facts: dict, estimate: Estimate | None = None) -> list[dict]:
    """One dict per size in plan order (see the module docstring); facts: {(source, tokenizer): {"vocab",
    "train_tokens" (None: unknown)}} (plan.corpus_facts)."""
    from anatomy_cli.sweep.calibrate import plan_seconds

    by_size: dict[str, list] = {}
    for p in plan:
        by_size.setdefault(p.size.name if p.size else "", []).append(p)
    rows = []
    for name, members in by_size.items():
        cfg = members[0].config
        fact = facts[cfg.data.corpus_key]
        model = cfg.model.model_copy(update={"vocab_size": fact["vocab"]})
        t = cfg.train
        tokens = t.steps * t.batch_size * model.ctx_len
        n = model.non_embedding_params()
        corpus = fact.get("train_tokens")
        row = {"size": name, "runs": len(members), "params": model.num_params(), "non_embedding_params": n,
               "active_params": model.active_params(), "steps": t.steps, "batch_size": t.batch_size,
               "ctx_len": model.ctx_len, "tokens": tokens, "flops": model.flops_per_token() * tokens,
               "est_s": None, "corpus_tokens": corpus, "corpus_tokens_per_param": corpus / n if corpus else None,
               "epochs": tokens / corpus if corpus else None, "device": t.device}
        if estimate is not None:
            row["est_s"] = plan_seconds([estimate.per_run[p.run_id] for p in members], estimate.workers,
                                        estimate.startup_s)
        row["warnings"] = warnings(row)
        size = members[0].size
        if size is not None and size.budget == "tokens-per-param" and size.tokens_per_param and t.steps == 1:
            raw = size.tokens_per_param * n / (t.batch_size * model.ctx_len)
            if raw < 1:
                row["warnings"].append(f"{ZERO_STEPS}: the budget gives {raw:.2g} steps of batch x ctx tokens "
                                       f"({size.tokens_per_param:g} x {count(n)} parameters), rounded up to 1: the "
                                       f"size learns nothing")
        twin = next((r for r in rows if r["non_embedding_params"] == n), None)
        if twin is not None:
            row["warnings"].append(f"{SAME_PARAMS} as {twin['size'] or '(base)'}: {count(n)} non-embedding (no trend "
                                   f"between them)")
        rows.append(row)
    return rows


OVERFIT_RISK, OVER_A_DAY, SAME_PARAMS, ZERO_STEPS = "overfit risk", "over a day", "same parameters", "0 steps"
NO_TREND = "no trend across sizes"


def warnings(row: dict) -> list[str]:
    """'overfit risk: 24 epochs over its corpus (> 10)', 'over a day: 1.5 days': each starts with its short name."""
    out = []
    if row["epochs"] is not None and row["epochs"] > MAX_EPOCHS:
        out.append(f"{OVERFIT_RISK}: {row['epochs']:.0f} epochs over its corpus (> {MAX_EPOCHS})")
    if row["est_s"] is not None and row["est_s"] > DAY_S:
        out.append(f"{OVER_A_DAY}: {row['est_s'] / DAY_S:.1f} days")
    return out


def trend_warnings(rows: list[dict]) -> list[str]:
    """The ladder's own warning when it cannot form any trend across sizes (size_rows' rows): one size,
    no size that trains (every budget under one step), or one parameter count among the sizes that
    train; [] for a ladder that can."""
    names = [r["size"] or "(base)" for r in rows]
    trains = [r for r in rows if not any(w.startswith(ZERO_STEPS) for w in r["warnings"])]
    counts = {r["non_embedding_params"] for r in trains}
    if len(rows) < 2:
        why = (f"one size ({', '.join(names)}); a trend needs two sizes or more with different non-embedding "
               f"parameter counts ([[sizes]] entries)")
    elif not trains:
        why = ("no size trains (its budget rounds up from under one step to 1); raise tokens_per_param or the "
               "sizes' parameters")
    elif len(trains) < 2:
        why = (f"only {trains[0]['size']} trains (the other sizes' budgets round up from under one step to 1); "
               f"raise tokens_per_param")
    elif len(counts) < 2:
        which = "every size" if len(trains) == len(rows) else "every size that trains"
        why = (f"{which} has {count(counts.pop())} non-embedding parameters ({', '.join(r['size'] for r in trains)}); "
               f"make the sizes differ in width or depth (d_model, n_layer), not only in what the count leaves out "
               f"(ctx_len, the vocabulary)")
    else:
        return []
    return [f"{NO_TREND}: {why}"]


def count(n: float | None) -> str:
    """1,234,567 -> '1.23M'; FLOPs 4.1e15 -> '4.1P'."""
    if n is None:
        return "?"
    for div, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}"
