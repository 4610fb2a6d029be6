"""The expected time of experiments/scale-gpu.toml on one H200, computed (not measured) from the H200
figures measured for issue #20, and the FLOPs of every planned run (no torch, no GPU, no corpus).

Measured (issue #20, one H200, torch 2.11, fp32 + torch.compile): the seed-size study
(five-flips-seed.toml: 12 runs x 2000 steps x 32 x 128 tokens = 98.3 M tokens, 1.2 M parameters at
vocab 1719) took 67.6 s at 12 workers, 1.454 M tokens/s in aggregate; a hand-written compiled model
of the same size with CUDA graphs, 8 runs at once, reached 10.4 M tokens/s.
Computed: each rate x the seed study's FLOPs per token (ModelConfig.flops_per_token, averaged over its
12 configs) is a FLOP rate; a size's time is the sum over its planned runs of tokens x FLOPs per token
(at an assumed vocabulary: the prepared corpus' is read by scale-plan) / that rate.
The first rate is an upper bound on the time (the seed size is launch-bound: 7.4 ms a step); larger
models fill the GPU better. `anatomy scale-plan experiments/scale-gpu.toml` on the GPU replaces both
with a calibration measured there.

    python benchmarks/scale_gpu_estimate.py [--vocab 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "src"))

SEED_TOKENS, SEED_WALL_S, SEED_VOCAB = 12 * 2000 * 32 * 128, 67.6, 1719  # issue #20: the measured study
HAND_WRITTEN_TOKENS_S = 10.4e6  # issue #20: a hand-written compiled model of the seed size, 8 at once


def main() -> None:
    from anatomy_cli.sweep.plan import expand, load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=200, help="vocabulary assumed for the spec's corpus")
    args = parser.parse_args()
    seed = [p.config.model.model_copy(update={"vocab_size": SEED_VOCAB}) for p in
            expand(load_spec(ROOT / "experiments" / "five-flips-seed.toml"))]
    seed_flops = sum(m.flops_per_token() for m in seed) / len(seed)
    rates = {"measured anatomy rate": SEED_TOKENS / SEED_WALL_S * seed_flops,
             "hand-written model rate": HAND_WRITTEN_TOKENS_S * seed_flops}
    print(f"seed study: {seed_flops / 1e6:.2f} MFLOP/token; " + "; ".join(
        f"{k}: {v / 1e12:.2f} TFLOP/s" for k, v in rates.items()))
    flops: dict[str, float] = {}
    for p in expand(load_spec(ROOT / "experiments" / "scale-gpu.toml")):
        m, t = p.config.model.model_copy(update={"vocab_size": args.vocab}), p.config.train
        flops[p.size.name] = flops.get(p.size.name, 0.0) + t.steps * t.batch_size * m.ctx_len * m.flops_per_token()
    for name, rate in rates.items():
        hours = {size: f / rate / 3600 for size, f in flops.items()}
        print(f"{name}: " + ", ".join(f"{s} {h:.2f} h" for s, h in hours.items())
              + f"; {sum(hours.values()):.1f} h in all")


if __name__ == "__main__":
    main()
