"""What periodic checkpoints cost: the default study's run trained with a checkpoint at every
evaluation (the default) and with none, interleaved in one process, paired per round.

The run is the five-flips base (d_model 128, 4 layers, ctx 64, batch 16, eval every 50 steps, the
2017 end) on the embedded corpus, `--steps` long; each round trains it once per variant, in an
order rotated per round, into a fresh folder through Trainer.run (so flushes, evaluations and
best.safetensors writes are in both). The ratio is wall time with checkpoints / without, the median
over rounds; the checkpoint's size and the metrics of both variants (identical: checkpoints never
change results) are printed too.

    python benchmarks/bench_checkpoint.py                  # ~3 minutes on 2 cores
    python benchmarks/bench_checkpoint.py --rounds 9 --steps 400
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from anatomy_cli import runs  # noqa: E402
from anatomy_cli.config import RunConfig, load_toml, validate  # noqa: E402
from anatomy_cli.data import load_corpus  # noqa: E402
from anatomy_cli.train import resolve_config  # noqa: E402
from anatomy_cli.trainer import Trainer  # noqa: E402

VARIANTS = {"every eval": {}, "none": {"checkpoint_every": 10**9}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-append", action="store_true")
    return p.parse_args(argv)


def base_config(steps: int, threads: int) -> dict:
    spec = load_toml(Path(__file__).resolve().parents[1] / "experiments" / "five-flips.toml")["base"]
    spec["train"].update(steps=steps, sample_len=0, threads=threads, device="cpu")
    return spec


def one_run(cfg: RunConfig, corpus) -> tuple[float, list[dict], int]:
    """(wall seconds of Trainer.run, metrics without timing, bytes of the last checkpoint)."""
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        tr = Trainer(cfg, Path(tmp), corpus)
        t0 = time.perf_counter()
        status, _ = tr.run()  # the run's checkpoint stays (train.train's lifecycle would remove it)
        secs = time.perf_counter() - t0
        assert status == runs.COMPLETED
        rows = [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(tmp)]
        ckpt = Path(tmp) / runs.RESUME
        return secs, rows, ckpt.stat().st_size if ckpt.exists() else 0


def main(argv=None) -> None:
    args = parse_args(argv)
    common.set_threads(args.threads)
    base = base_config(args.steps, args.threads)
    corpus = load_corpus(None, 0.1, base["model"]["ctx_len"])
    cfgs = {name: resolve_config(validate(RunConfig, {**base, "train": {**base["train"], **opts}}), corpus)
            for name, opts in VARIANTS.items()}
    print(common.describe())
    one_run(cfgs["none"], corpus)  # warm-up: allocator, thread pools, page cache
    secs: dict[str, list[float]] = {n: [] for n in cfgs}
    metrics, size = {}, 0
    names = list(cfgs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            s, metrics[name], b = one_run(cfgs[name], corpus)
            secs[name].append(s)
            size = max(size, b)
        print(f"round {r + 1}: " + ", ".join(f"{n} {secs[n][-1]:.2f} s" for n in names), flush=True)
    ratios = [a / b for a, b in zip(secs["every eval"], secs["none"])]
    n_ckpt = (args.steps - 1) // base["train"]["eval_interval"]
    lines = common.table(
        ["variant", "checkpoints", "median s", "spread"],
        [[n, n_ckpt if n == "every eval" else 0, f"{common.median(secs[n]):.2f}", f"{common.spread(secs[n]):.1%}"]
         for n in names])
    lines += ["", f"every eval / none: {common.median(ratios):.3f}x (paired over {len(ratios)} rounds, spread "
                  f"{common.spread(ratios):.1%}); {args.steps} steps, eval every {base['train']['eval_interval']}, "
                  f"checkpoint {size / 2**20:.1f} MiB; metrics identical: {metrics['every eval'] == metrics['none']}"]
    print("\n".join(lines))
    if not args.no_append:
        common.append_results("bench_checkpoint: periodic checkpoint overhead", common.command_line(), lines)


if __name__ == "__main__":
    main()
