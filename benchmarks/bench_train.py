"""Training step time (forward + backward + clip + AdamW step) at the seed size, on CPU.

Variants, all interleaved round by round so machine noise hits each alike:
  anatomy    anatomy_cli.model.LM + anatomy_cli.training.trainer.make_optimizer (fused AdamW), the exact step
             of Trainer.train_step (lr set, autocast, loss.backward, clip_grad_norm_, step, zero_grad)
  reference  benchmarks/reference.py: the hand-written "slow" model + plain AdamW, same step
  +compile   anatomy with torch.compile on the forward, as Trainer does (--compile)
  +bf16      anatomy under bf16 autocast (--bf16)

Model FLOP/s = ModelConfig.flops_per_token() x tokens/s, compared with fp32 sgemm measured in
this process with the same threads. `--bf16-loss-steps N` also trains N real steps on
tinyshakespeare with fp32 and with bf16 autocast (same seed, same batches) and compares val loss.

    python benchmarks/bench_train.py                       # ~1 minute
    python benchmarks/bench_train.py --compile --bf16 --repeats 15
    python benchmarks/bench_train.py --bf16 --bf16-loss-steps 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import reference  # noqa: E402

from anatomy_cli.model import LM  # noqa: E402
from anatomy_cli.spec.components import model_settings  # noqa: E402
from anatomy_cli.spec.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from anatomy_cli.training.devices import keep_freed_memory  # noqa: E402
from anatomy_cli.training.trainer import make_optimizer  # noqa: E402

# the LLaMA parts at full K/V heads (n_kv_head stays the config's): GQA is timed separately
CONFIGS = {"2017": {}, "llama": {k: v for k, v in model_settings().items() if k != "n_kv_head"}}
DEFAULT_TEXT = common.REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128, help="T = ctx_len")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2, help="LLaMA's n_kv_head (2017: --heads)")
    p.add_argument("--vocab", type=int, default=1719)
    p.add_argument("--configs", nargs="+", default=["2017", "llama"], choices=list(CONFIGS))
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant (compiled: +2)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds; each round runs every variant")
    p.add_argument("--inner", type=int, default=1, help="steps per variant per round")
    p.add_argument("--budget", type=float, default=45.0, help="no new round after S seconds (>= 3 rounds)")
    p.add_argument("--no-reference", action="store_true", help="skip the hand-written reference")
    p.add_argument("--compile", action="store_true", help="also time anatomy under torch.compile")
    p.add_argument("--bf16", action="store_true", help="also time anatomy under bf16 autocast")
    p.add_argument("--bf16-loss-steps", type=int, default=0,
                   help="train N steps fp32 and bf16 on real text and compare val loss")
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="text for --bf16-loss-steps")
    p.add_argument("--peak-sizes", type=int, nargs="+", default=[1024, 2048], help="sgemm sizes for the peak")
    p.add_argument("--no-append", action="store_true", help="do not append to benchmarks/RESULTS.md")
    return p.parse_args(argv)


def model_config(name: str, args) -> ModelConfig:
    kv = args.kv_heads if name == "llama" else args.heads
    return ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layer=args.layers, n_head=args.heads,
                       n_kv_head=kv, ctx_len=args.seq, **CONFIGS[name])


def make_step(model, fwd, opt, x, y, dtype: torch.dtype | None, lr: float = 3e-4, clip: float = 1.0):
    """One step exactly as Trainer.train_step does it (minus the sampler and bookkeeping)."""
    autocast = torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    params = list(model.parameters())

    def step():
        for group in opt.param_groups:
            group["lr"] = lr
        with autocast:
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def build_variants(args, cfg_name: str, x, y) -> dict:
    """name -> (step fn, warmup steps) for one config; every variant has its own model."""
    cfg = model_config(cfg_name, args)
    t = TrainConfig()
    dev = torch.device("cpu")
    variants = {}

    def anatomy(compiled: bool, dtype):
        torch.manual_seed(0)
        model = LM(cfg)
        fwd = torch.compile(model) if compiled else model
        return make_step(model, fwd, make_optimizer(model, t, dev), x, y, dtype)

    variants[f"{cfg_name}/anatomy"] = (anatomy(False, None), args.warmup)
    if not args.no_reference:
        torch.manual_seed(0)
        ref = reference.RefLM(cfg)
        assert ref.num_params() == LM(cfg).num_params() == cfg.num_params(), "parameter counts differ"
        variants[f"{cfg_name}/reference"] = (make_step(ref, ref, reference.make_optimizer(ref), x, y, None),
                                             args.warmup)
    if args.compile:
        variants[f"{cfg_name}/anatomy+compile"] = (anatomy(True, None), args.warmup + 2)
    if args.bf16:
        variants[f"{cfg_name}/anatomy+bf16"] = (anatomy(False, torch.bfloat16), args.warmup)
    if args.compile and args.bf16:
        variants[f"{cfg_name}/anatomy+compile+bf16"] = (anatomy(True, torch.bfloat16), args.warmup + 2)
    return variants


def paired_ratio(samples: dict, a: str, b: str) -> tuple[float, float] | None:
    """Median over rounds of time[a]/time[b] (paired within a round), and its spread."""
    if a not in samples or b not in samples:
        return None
    ratios = [ta / tb for ta, tb in zip(samples[a], samples[b])]
    return common.median(ratios), common.spread(ratios)


def bf16_loss(args, cfg_name: str) -> dict:
    """Train the seed config N steps with fp32 and with bf16 autocast from one seed; val losses."""
    from anatomy_cli.data.load import load_corpus
    from anatomy_cli.training.run import resolve_config
    from anatomy_cli.training.trainer import Trainer

    source = str(args.text) if args.text.is_file() else None  # None: anatomy's embedded corpus
    corpus = load_corpus(source, 0.1, args.seq)
    m = model_config(cfg_name, args).model_copy(update={"vocab_size": None})
    out = {"source": args.text.name if source else "embedded default corpus", "steps": args.bf16_loss_steps}
    for dtype in ("float32", "bfloat16"):
        t = TrainConfig(steps=args.bf16_loss_steps, batch_size=args.batch, device="cpu", dtype=dtype,
                        threads=args.threads, warmup=min(100, args.bf16_loss_steps // 10), eval_batches=8)
        cfg = resolve_config(RunConfig(seed=1337, model=m, train=t, data=DataConfig(source=source)), corpus)
        with tempfile.TemporaryDirectory() as tmp:
            tr = Trainer(cfg, Path(tmp), corpus)
            t0 = time.perf_counter()
            tr.train_steps(t.steps)
            tr.sync()
            secs = time.perf_counter() - t0
            out[dtype] = {"val_loss": tr.evaluate(), "train_loss": float(tr.last.loss), "s": secs}
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    common.set_threads(args.threads)
    kept = keep_freed_memory()  # as `anatomy train` does on CPU; every variant here shares it
    print(common.describe())
    peak = common.matmul_peak(tuple(args.peak_sizes))
    print(f"fp32 matmul peak: {peak['gflops']:.1f} GFLOP/s (n={peak['n']})")

    g = torch.Generator().manual_seed(0)
    x = torch.randint(args.vocab, (args.batch, args.seq), generator=g)
    y = torch.randint(args.vocab, (args.batch, args.seq), generator=g)
    variants, warm = {}, {}
    for name in args.configs:
        for k, (fn, w) in build_variants(args, name, x, y).items():
            variants[k], warm[k] = fn, w
    # Warm-up per variant (compile happens here), then interleaved rounds.
    t0 = time.perf_counter()
    for k, fn in variants.items():
        for _ in range(warm[k]):
            fn()
    print(f"warm-up done in {time.perf_counter() - t0:.1f} s; timing {len(variants)} variants ...")
    samples = common.time_interleaved(variants, warmup=0, repeats=args.repeats, inner=args.inner,
                                      budget_s=args.budget)
    peak2 = common.matmul_peak(tuple(args.peak_sizes), repeats=3)  # again after: keep the better
    if peak2["gflops"] > peak["gflops"]:
        peak = peak2

    tokens = args.batch * args.seq
    rows = []
    for k, secs in samples.items():
        cfg = model_config(k.split("/")[0], args)
        ms, tok_s = 1000 * common.median(secs), tokens / common.median(secs)
        gflops = cfg.flops_per_token() * tok_s / 1e9
        rows.append([k, f"{cfg.num_params():,}", f"{ms:.1f}", f"{1000 * min(secs):.1f}",
                     f"±{100 * common.spread(secs):.0f}%",
                     f"{tok_s:,.0f}", f"{gflops:.1f}", f"{100 * gflops / peak['gflops']:.1f}%"])
    headers = ["variant", "params", "ms/step", "min ms", "spread", "tokens/s", "model GFLOP/s", "% of sgemm"]
    lines = common.table(headers, rows)
    rounds = len(next(iter(samples.values())))
    lines += ["", f"B={args.batch} T={args.seq} d={args.d_model} L={args.layers} H={args.heads} "
                  f"(llama G={args.kv_heads}) V={args.vocab}; {rounds} interleaved "
                  f"rounds x {args.inner} step(s), median; spread = IQR/2 over rounds; fp32 sgemm peak "
                  f"{peak['gflops']:.1f} GFLOP/s (n={peak['n']}, {args.threads} threads); glibc heap kept "
                  f"(keep_freed_memory, all variants): {kept}.", ""]
    ratios = []

    def ratio_line(label, a, b):
        r = paired_ratio(samples, a, b)
        if r is not None:
            ratios.append([label, f"{r[0]:.2f}x", f"±{100 * r[1]:.0f}%"])

    for v in ("anatomy", "reference", "anatomy+compile", "anatomy+bf16"):
        ratio_line(f"step time LLaMA / 2017 ({v})", f"llama/{v}", f"2017/{v}")
    for c in args.configs:
        ratio_line(f"anatomy speed-up over reference ({c})", f"{c}/reference", f"{c}/anatomy")
        ratio_line(f"anatomy+compile speed-up over reference ({c})", f"{c}/reference", f"{c}/anatomy+compile")
        ratio_line(f"torch.compile speed-up ({c})", f"{c}/anatomy", f"{c}/anatomy+compile")
        ratio_line(f"bf16 autocast speed-up ({c})", f"{c}/anatomy", f"{c}/anatomy+bf16")
        ratio_line(f"compile+bf16 speed-up over eager fp32 ({c})", f"{c}/anatomy",
                   f"{c}/anatomy+compile+bf16")
    if ratios:
        lines += common.table(["ratio (paired per round)", "median", "spread"], ratios)

    if args.bf16_loss_steps:
        loss_rows = []
        for c in args.configs:
            r = bf16_loss(args, c)
            f32, b16 = r["float32"], r["bfloat16"]
            loss_rows.append([c, r["source"], r["steps"], f"{f32['val_loss']:.5f}", f"{b16['val_loss']:.5f}",
                              f"{b16['val_loss'] - f32['val_loss']:+.5f}",
                              f"{f32['s']:.1f} / {b16['s']:.1f}"])
        headers = ["config", "data", "steps", "val loss fp32", "val loss bf16", "bf16 - fp32",
                   "train s fp32 / bf16"]
        lines += ["", *common.table(headers, loss_rows)]
    print("\n".join(lines))
    if not args.no_append:
        path = common.append_results("Training step time (bench_train.py)", common.command_line(), lines)
        print(f"appended to {path}")


if __name__ == "__main__":
    main()
