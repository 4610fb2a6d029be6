"""Greedy decode speed with and without the KV cache, batch 1, LLaMA (RoPE) config at the seed size.

Uses anatomy_cli.model.generate.generate with window = prefix + max_new, so no context shift happens and
the cached run uses its cache for every token; the uncached run re-reads the whole context each
step (O(n^2) work). Both must emit identical ids (checked). Tokens/s = max_new / wall time of one
generate call (prefill included). Also prints the KV cache bytes for n_kv_head in {4, 2, 1}.

    python benchmarks/bench_decode.py                     # ~1 minute
    python benchmarks/bench_decode.py --new 100 1000 4000 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from anatomy_cli.model import LM  # noqa: E402
from anatomy_cli.model.generate import generate  # noqa: E402
from anatomy_cli.spec.config import ModelConfig  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1719)
    p.add_argument("--ctx", type=int, default=128, help="ctx_len of the config (RoPE decodes past it)")
    p.add_argument("--prefix", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--new", type=int, nargs="+", default=[100, 1000], help="new-token counts to measure")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds per length (at most)")
    p.add_argument("--budget", type=float, default=40.0,
                   help="per length: no new round after this many seconds (lengths <= 200: >= 3 rounds)")
    p.add_argument("--no-append", action="store_true", help="do not append to benchmarks/RESULTS.md")
    return p.parse_args(argv)


def llama_config(args, n_kv_head: int | None = None) -> ModelConfig:
    return ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layer=args.layers, n_head=args.heads,
                       n_kv_head=n_kv_head or args.kv_heads, ctx_len=args.ctx, norm_type="rmsnorm",
                       norm_pos="pre", pos_type="rope", ffn_type="swiglu")


def main(argv=None) -> None:
    args = parse_args(argv)
    common.set_threads(args.threads)
    print(common.describe())
    cfg = llama_config(args)
    torch.manual_seed(0)
    model = LM(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(cfg.vocab_size, (args.prefix,), generator=gen).tolist()

    rows, ids_equal = [], True
    list(generate(model, prefix, 20, temp=0.0, window=args.prefix + 20))  # warm-up (first-call allocations)
    for n in args.new:
        window = args.prefix + n  # >= prefix + max_new: no context shift, the cache serves every token
        out = {}

        def run(use_cache: bool, n=n, window=window, out=out):
            ids = list(generate(model, prefix, n, temp=0.0, use_cache=use_cache, window=window))
            out[use_cache] = ids

        samples = common.time_interleaved({"cached": lambda: run(True), "uncached": lambda: run(False)},
                                          warmup=0, repeats=args.repeats, budget_s=args.budget,
                                          min_rounds=3 if n <= 200 else 1)
        ids_equal &= out[True] == out[False]
        ratios = [u / c for c, u in zip(samples["cached"], samples["uncached"])]
        c_s, u_s = common.median(samples["cached"]), common.median(samples["uncached"])
        rows.append([n, window, f"{n / c_s:,.0f}", f"{n / min(samples['cached']):,.0f}", f"{n / u_s:,.0f}",
                     f"{n / min(samples['uncached']):,.0f}", f"{common.median(ratios):.1f}x",
                     f"±{100 * common.spread(ratios):.0f}%", len(ratios),
                     "yes" if out[True] == out[False] else "NO"])
        print(f"  {n} new tokens: cached {n / c_s:,.0f} tok/s, uncached {n / u_s:,.0f} tok/s")
    lines = common.table(["new tokens", "window", "cached tok/s", "(best)", "uncached tok/s", "(best)",
                          "cached/uncached", "spread", "rounds", "same ids"], rows)
    lines += ["", f"LLaMA config d={args.d_model} L={args.layers} H={args.heads} G={args.kv_heads} "
                  f"V={args.vocab} ctx_len={args.ctx}, untrained weights, greedy, batch 1, prefix "
                  f"{args.prefix} tokens; tok/s = new tokens / wall time of one generate call (prefill "
                  f"included), median over interleaved rounds (best in brackets).", ""]

    kv_rows = []
    long = args.prefix + max(args.new)
    for g in (4, 2, 1):
        if args.heads % g:
            continue
        c = llama_config(args, g)
        measured = LM(c).new_cache(1, long).cache_bytes()
        per_tok = c.cache_bytes(1, 1, 4)
        assert measured == c.cache_bytes(1, long, 4)
        at_ctx = c.cache_bytes(1, args.ctx, 4)
        bf16 = c.cache_bytes(1, long, 2)
        kv_rows.append([g, args.heads // g, per_tok, f"{at_ctx:,}", f"{measured:,}", f"{bf16:,}"])
    lines += common.table(["n_kv_head", "queries per kv head", "bytes/token fp32", f"fp32 @ {args.ctx} tok",
                           f"fp32 @ {long} tok (allocated)", f"bf16 @ {long} tok"], kv_rows)
    print("\n".join(lines))
    if not ids_equal:
        print("ERROR: cached and uncached greedy ids differ", file=sys.stderr)
    if not args.no_append:
        path = common.append_results("Decode speed, KV cache (bench_decode.py)", common.command_line(), lines)
        print(f"appended to {path}")
    if not ids_equal:
        sys.exit(1)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - t0:.0f} s")
