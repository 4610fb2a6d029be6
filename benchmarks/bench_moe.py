"""Mixture-of-experts training step: the dispatch anatomy uses against two fixed-shape forms, on CPU.

Variants, all interleaved round by round (same weights, same batch, the step of Trainer.train_step:
forward, backward of CE + 0.001 x balance loss, clip_grad_norm_, fused AdamW, zero_grad):
  dense    the LLaMA model without MoE (its FFN has the same active parameters): the yardstick
  sorted   anatomy_cli.model.moe.MoE as built: slots sorted by expert, one matmul chain per expert
           on its slice (slice sizes depend on the data: one host read per layer; no vmap)
  masked   fixed shapes: every expert on every token ([N, E, h]), then each slot gathers its
           expert's output (E/k times the expert FLOPs; vmap-able)
  grouped  fixed shapes: the sorted slots through torch's grouped_mm with device-side offsets
           (no host read; on CPU its sizes must be 16-byte aligned and torch.compile needs bf16)

Ratios are paired per round against `sorted`; masked/sorted > 1 means the fixed-shape form is slower.

    python benchmarks/bench_moe.py                  # seed size: d 128, 4 layers, B 16 x T 64 = 1024 tokens
    python benchmarks/bench_moe.py --threads 1 --repeats 15
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from anatomy_cli.model import LM  # noqa: E402
from anatomy_cli.model.moe import MoE, activate  # noqa: E402
from anatomy_cli.spec.components import model_settings  # noqa: E402
from anatomy_cli.spec.config import ModelConfig, TrainConfig  # noqa: E402
from anatomy_cli.training.devices import keep_freed_memory  # noqa: E402
from anatomy_cli.training.trainer import make_optimizer  # noqa: E402


def masked_experts(self: MoE, flat, slots, counts):
    """Every expert on every token, then each slot's expert picked: [N k, C] in slot order."""
    N, C = flat.shape
    E = self.up.weight.shape[0]
    h = activate(F.linear(flat, self.up.weight.reshape(-1, C)).view(N, E, -1), self.ffn_type)  # [N, E, h]
    out = torch.einsum("neh,ech->nec", h, self.down.weight)  # [N, E, C]
    return out.gather(1, slots.view(N, self.k, 1).expand(N, self.k, C)).reshape(N * self.k, C)


def grouped_experts(self: MoE, flat, slots, counts):
    """The sorted slots through grouped_mm, offsets on the device: [N k, C] in slot order."""
    N, C = flat.shape
    order = slots.argsort(stable=True)
    xs = flat.unsqueeze(1).expand(N, self.k, C).reshape(N * self.k, C)[order]
    offs = counts.cumsum(0).to(torch.int32)
    h = activate(F.grouped_mm(xs, self.up.weight.transpose(1, 2), offs=offs), self.ffn_type)
    return F.grouped_mm(h, self.down.weight.transpose(1, 2), offs=offs)[order.argsort()]


DISPATCH = {"sorted": MoE.experts, "masked": masked_experts, "grouped": grouped_experts}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64, help="T = ctx_len")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1719)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9, help="timed rounds; each round runs every variant")
    p.add_argument("--budget", type=float, default=60.0, help="no new round after S seconds (>= 3 rounds)")
    p.add_argument("--no-append", action="store_true", help="print only; do not append to RESULTS.md")
    return p.parse_args(argv)


def make_step(cfg: ModelConfig, dispatch, x, y):
    torch.manual_seed(0)
    model = LM(cfg)
    opt = make_optimizer(model, TrainConfig(), torch.device("cpu"))

    def step():
        logits, loss, aux = model(x, y, aux=True)
        (loss + 0.001 * aux["moe_aux_loss"] if aux else loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if dispatch is None:
        return step

    def patched():  # this variant's dispatch for the duration of its step only
        saved, MoE.experts = MoE.experts, dispatch
        try:
            step()
        finally:
            MoE.experts = saved

    return patched


def main(argv=None) -> None:
    args = parse_args(argv)
    common.set_threads(args.threads)
    keep_freed_memory()
    llama = {**model_settings(), "n_kv_head": 2}
    base = dict(vocab_size=args.vocab, d_model=args.d_model, n_layer=args.layers, n_head=4, ctx_len=args.seq, **llama)
    dense, moe = ModelConfig(**base), ModelConfig(**base, moe=True)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(args.vocab, (args.batch, args.seq), generator=g) for _ in range(2))
    fns = {"dense": make_step(dense, None, x, y)}
    fns |= {name: make_step(moe, fn, x, y) for name, fn in DISPATCH.items()}
    samples = common.time_interleaved(fns, warmup=args.warmup, repeats=args.repeats, budget_s=args.budget)
    tokens = args.batch * args.seq
    rows = []
    for name, secs in samples.items():
        cfg = dense if name == "dense" else moe
        ratio = [a / b for a, b in zip(secs, samples["sorted"])]
        rows.append([name, f"{cfg.num_params():,}", f"{cfg.active_params():,}", f"{1000 * common.median(secs):.1f}",
                     f"±{100 * common.spread(secs):.0f}%", f"{tokens / common.median(secs):,.0f}",
                     f"{common.median(ratio):.2f}x", f"±{100 * common.spread(ratio):.0f}%"])
    lines = common.table(["variant", "params", "active", "ms/step", "spread", "tokens/s", "vs sorted", "spread"], rows)
    lines += ["", f"B={args.batch} T={args.seq} ({tokens} tokens) d={args.d_model} L={args.layers} H=4 G=2 "
                  f"V={args.vocab}; MoE: {moe.moe_experts} experts, top-{moe.moe_top_k}, "
                  f"hidden {moe.moe_expert_hidden} (dense {moe.ffn_hidden}); {len(samples['sorted'])} "
                  f"interleaved rounds, median; ratios paired per round."]
    common.publish("Mixture-of-experts dispatch (bench_moe.py)", lines, append=not args.no_append)


if __name__ == "__main__":
    main()
