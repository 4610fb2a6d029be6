"""How often DeepSeek sparse attention's selection hangs on a tie (issue 37, cause 11).

A dsa query reads the top_k earlier keys its lightning indexer scores highest (model/dsa.py). A key's
score is sum_h w[t, h] ReLU(q_I[h, t] . k_I[s] / sqrt(D)): exactly 0 whenever every indexer head's ReLU
is 0, so with few heads many keys share the score 0 and which of them a query reads is left to the
tie rule (anatomy: the earlier key; HF's torch.topk: whatever its kernel does). This measures, through
the product's own model code (the LM a Trainer builds from each RunConfig, its Indexer.scores), the
share of the queries where top-k binds (more than top_k causal keys) whose k-th and (k+1)-th scores
are equal: a tie at the k-th score, so the keys read depend on the tie rule.

Shapes: every dsa model of a shipped spec (experiments/*.toml, seed 1337) and the built-in dsa row at
the default study's shape (demo.toml's base, d 128, 4 heads, ctx 64). Each at indexer-head counts 2,
4, 8, 16 (dsa_index_heads; the rest as the spec has it), at init and after --steps training steps
(Trainer.train_step, the indexer learning by its own KL loss as in a study). Queries: the run's own
validation windows (its eval_batches x batch_size windows of the embedded corpus; --windows caps them).

    python benchmarks/dsa_ties.py                 # ~1-2 minutes on 2 cores
    python benchmarks/dsa_ties.py --steps 0       # init only
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import REPO_ROOT, publish, set_threads  # puts the checkout's src on sys.path

from anatomy_cli.data.load import load_corpus  # noqa: E402
from anatomy_cli.model.dsa import Indexer  # noqa: E402
from anatomy_cli.spec.config import RunConfig, validate  # noqa: E402
from anatomy_cli.sweep.plan import expand, load_spec  # noqa: E402
from anatomy_cli.training.run import resolve_config  # noqa: E402
from anatomy_cli.training.trainer import Trainer  # noqa: E402

HEADS = (2, 4, 8, 16)


def shipped_shapes() -> dict[str, RunConfig]:
    """{name: RunConfig} of every distinct dsa model in experiments/*.toml (its first seed), and the built-in
    dsa row at the default study's base."""
    out: dict[str, RunConfig] = {}
    for path in sorted((REPO_ROOT / "experiments").glob("*.toml")):
        for p in expand(load_spec(path)):
            if p.config.model.dsa and p.config.seed == load_spec(path).base.seed:
                out.setdefault(f"{path.stem}:{p.slug}", p.config)
    demo = load_spec(REPO_ROOT / "experiments" / "demo.toml").base.model_dump(mode="json")
    demo["model"] |= {"attn_type": "mla", "dsa": True}
    out["demo base + dsa (built-in row)"] = validate(RunConfig, demo)
    return out


def with_heads(cfg: RunConfig, heads: int) -> RunConfig:
    data = cfg.model_dump(mode="json")
    data["model"]["dsa_index_heads"] = heads
    return validate(RunConfig, data)


class Ties:
    """Counts, over every dsa layer's forward, the queries where top-k binds and those with a tie at the k-th."""

    def __init__(self, model: torch.nn.Module):
        self.binding = self.tied = self.zero = 0
        self.handles = [m.register_forward_hook(self.hook, with_kwargs=True)
                        for m in model.modules() if isinstance(m, Indexer)]

    def hook(self, indexer: Indexer, args, kwargs, _out) -> None:
        index, causal = indexer.scores(*args, **kwargs)  # the scores the selection just used
        k = indexer.top_k
        binds = causal.sum(-1) > k  # [T]: more causal keys than the query reads
        if not binds.any():
            return
        ranked = index.masked_fill(~causal, float("-inf")).sort(dim=-1, descending=True).values  # [B, T, S]
        kth, next_ = ranked[..., k - 1], ranked[..., k]  # [B, T]
        b = binds.expand_as(kth)
        self.binding += int(b.sum())
        self.tied += int(((kth == next_) & b).sum())
        self.zero += int(((kth == 0) & (next_ == 0) & b).sum())

    def rate(self) -> float:
        return self.tied / self.binding if self.binding else 0.0

    def cell(self) -> str:
        return f"{self.rate():.1%} ({self.tied}; at 0: {self.zero})"


@torch.no_grad()
def measure(tr: Trainer, windows: int) -> Ties:
    tr.model.eval()
    ties = Ties(tr.model)
    try:
        seen = 0
        for x, _ in tr.val:
            x = x[: max(0, windows - seen)]
            if not len(x):
                break
            tr.model(x)
            seen += len(x)
    finally:
        for h in ties.handles:
            h.remove()
        tr.model.train()
    return ties


def ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=ints, default=[10, 20, 30],
                    help="measure again after these many training steps (comma-separated; '' for init only)")
    ap.add_argument("--long-steps", type=ints, default=[],
                    help="the same for shapes with ctx_len > 256 (a long-context step costs ~10x a ctx-64 one: "
                         "~2-8 s on 2 cores; default init only)")
    ap.add_argument("--heads", type=ints, default=list(HEADS), help="indexer-head counts (the default is added)")
    ap.add_argument("--only", default="", help="only the shapes whose name contains this")
    ap.add_argument("--windows", type=int, default=8, help="validation windows measured per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-append", action="store_true", help="print only; do not append to RESULTS.md")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    start = time.perf_counter()
    corpus = load_corpus(None, 0.1, 512)
    shapes = {k: v for k, v in shipped_shapes().items() if args.only in k}
    checkpoints = sorted({*args.steps, *args.long_steps})
    rows = [["shape", "ctx", "top_k", "indexer heads", "binding queries", "tied at init",
             *(f"after {n} steps" for n in checkpoints)]]
    for name, base in shapes.items():
        steps = args.long_steps if base.model.ctx_len > 256 else args.steps
        derived = base.model.dsa_dims.index_n_heads  # what spec/config.py's dsa_dims derives for this shape
        for heads in sorted({*args.heads, derived}):
            cfg = resolve_config(with_heads(base, heads), corpus)
            with tempfile.TemporaryDirectory() as tmp:
                tr = Trainer(cfg, Path(tmp), corpus)
                seen = {0: measure(tr, args.windows)}
                for n in steps:
                    while tr.step < n:
                        tr.train_step()
                    seen[n] = measure(tr, args.windows)
                tr.log.close()
            rows.append([name, str(cfg.model.ctx_len), str(cfg.model.dsa_dims.top_k),
                         f"{heads}" + (" (default)" if heads == derived else ""), str(seen[0].binding),
                         *(seen[n].cell() if n in seen else "-" for n in [0, *checkpoints])])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    table.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines = [*table, "", f"tied: the share of the queries where top-k binds (more than top_k causal keys) whose "
             f"k-th and (k+1)-th index scores are equal (tied of binding; at 0: both exactly 0, every indexer head's "
             f"ReLU 0), over every dsa layer and the first {args.windows} validation windows of the embedded corpus; "
             f"seed 1337's init (Trainer), then Trainer.train_step with the spec's batch and the indexer loss on; "
             f"{time.perf_counter() - start:.0f} s."]
    publish("DSA selection ties (dsa_ties.py)", lines, append=not args.no_append)


if __name__ == "__main__":
    main()
