"""`anatomy sample` threads: one sequence decoded with 1 thread vs all cores, with the machine as it
is and with one extra busy process (a pure-Python spin loop, one core), paired and interleaved.

Decode at batch 1 is a chain of small matmuls: with several threads each op waits for its slowest
thread, so one busy core can stall every token. Prints tokens/s per case and the ratio per round.

    python benchmarks/bench_sample_threads.py            # ~1 minute
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402,F401  (puts src/ on the path)

from anatomy_cli.model import LM  # noqa: E402
from anatomy_cli.model.generate import generate  # noqa: E402
from anatomy_cli.spec.config import ModelConfig  # noqa: E402

NEW, ROUNDS = 300, 6


def tokens_per_s(model, threads: int) -> float:
    torch.set_num_threads(threads)
    t = time.perf_counter()
    for _ in generate(model, [1, 2, 3, 4], NEW, temp=0.8, seed=0):
        pass
    return NEW / (time.perf_counter() - t)


def measure(model, label: str) -> None:
    cores = os.cpu_count() or 1
    got = {1: [], cores: []}
    for r in range(ROUNDS):
        for threads in ([1, cores] if r % 2 == 0 else [cores, 1]):  # alternate which goes first
            got[threads].append(tokens_per_s(model, threads))
    ratios = [a / b for a, b in zip(got[1], got[cores])]
    print(f"{label}: load {os.getloadavg()[0]:.1f} on {cores} cores; tokens/s 1 thread "
          f"{statistics.median(got[1]):.0f}, {cores} threads {statistics.median(got[cores]):.0f}; "
          f"1-thread / {cores}-thread per round: " + " ".join(f"{x:.2f}" for x in ratios)
          + f" (median {statistics.median(ratios):.2f})")


def main() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=1719, d_model=128, n_layer=4, n_head=4, n_kv_head=2, ctx_len=64,
                      norm_type="rmsnorm", norm_pos="pre", pos_type="rope", ffn_type="swiglu")
    model = LM(cfg).eval()
    tokens_per_s(model, 1)  # warm-up
    measure(model, "as is")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        measure(model, "one more busy process")
    finally:
        spin.kill()
        spin.wait()


if __name__ == "__main__":
    main()
