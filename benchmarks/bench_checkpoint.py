"""What periodic checkpoints cost: one checkpoint against the training interval it closes, at the
default study's size, paired per round in one process.

The run is the five-flips base (d_model 128, 4 layers, ctx 64, batch 16, eval every 50 steps, the
2017 end) on the embedded corpus. Each round trains one interval the way Trainer.run does (50
steps, their metric lines, one evaluation) and then writes the checkpoint that closes it
(Trainer.checkpoint: the durable flush and resume.pt, fsynced and renamed), timing both; the ratio
(interval + checkpoint) / interval, median over rounds, is what a checkpoint at every evaluation
(the default) adds to training time.

    python benchmarks/bench_checkpoint.py                  # ~2 minutes on 2 idle cores
    python benchmarks/bench_checkpoint.py --rounds 15
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from anatomy_cli.data.load import load_corpus  # noqa: E402
from anatomy_cli.spec.config import RunConfig, load_toml, validate  # noqa: E402
from anatomy_cli.store import runs  # noqa: E402
from anatomy_cli.training.run import resolve_config  # noqa: E402
from anatomy_cli.training.trainer import Trainer  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-append", action="store_true")
    return p.parse_args(argv)


def interval(tr: Trainer, steps: int) -> None:
    """`steps` training steps booked as Trainer.run books them, then the evaluation that ends them."""
    for _ in range(steps):
        tr.log.pending.append(tr.train_step())
        if tr.step % tr.cfg.train.log_interval == 0:
            tr.log.flush(tr.step)
    tr.log.flush(tr.step, tr.eval_point())


def main(argv=None) -> None:
    args = parse_args(argv)
    common.set_threads(args.threads)
    base = load_toml(Path(__file__).resolve().parents[1] / "experiments" / "five-flips.toml")["base"]
    base["train"].update(sample_len=0, threads=args.threads, device="cpu")
    corpus = load_corpus(None, 0.1, base["model"]["ctx_len"])
    cfg = resolve_config(validate(RunConfig, base), corpus)
    every = cfg.train.eval_interval
    print(common.describe())
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        tr = Trainer(cfg, Path(tmp), corpus)
        interval(tr, every)  # warm-up: allocator, thread pools, page cache
        tr.checkpoint()
        train_s, ckpt_s = [], []
        for r in range(args.rounds):
            t0 = time.perf_counter()
            interval(tr, every)
            t1 = time.perf_counter()
            tr.checkpoint()
            train_s.append(t1 - t0)
            ckpt_s.append(time.perf_counter() - t1)
            print(f"round {r + 1}: interval {train_s[-1]:.2f} s, checkpoint {ckpt_s[-1]:.3f} s", flush=True)
        size = (Path(tmp) / runs.RESUME).stat().st_size
    ratios = [(a + b) / a for a, b in zip(train_s, ckpt_s)]
    rows = [[f"{every} steps + 1 eval", f"{common.median(train_s):.2f}", f"{common.spread(train_s):.1%}"],
            ["checkpoint", f"{common.median(ckpt_s):.3f}", f"{common.spread(ckpt_s):.1%}"]]
    verdict = (f"checkpoint at every evaluation: {common.median(ratios):.3f}x the training time (paired over "
               f"{len(ratios)} rounds, spread {common.spread(ratios):.1%}); resume.pt {size / 2**20:.1f} MiB")
    common.publish("bench_checkpoint: periodic checkpoint overhead",
                   [*common.table(["what", "median s", "spread"], rows), "", verdict], not args.no_append)


if __name__ == "__main__":
    main()
