"""Budget ladder check on the demo's size (issue 47): decays branched from one warmup-stable-decay run against
runs trained to each budget from the start, through the real training code (training.run.train,
training.branch.branch, training.budgets.budget_ladder).

The model and data: experiments/demo.toml's LLaMA end (d_model 128, 4 layers, batch 16 x 64, lr 1e-3,
warmup 50, eval every 30 steps), at budgets 100, 200 and 300 steps (the demo's 300-step scale), wsd with
a 20 % 1-sqrt decay (train.decay_frac 0.2; Hägele et al. 2024). Per seed:
  ladder     the stable run to 300 steps, keeping its checkpoints at 80 and 160, then decays from them to
             100 and 200 (20 and 40 steps each): the loss at three budgets for 360 steps
  scratch    wsd runs to 100 and 200 from step 0 (the 300 one is the ladder's stable run itself)
  cosine     the demo's own schedule, to 100, 200 and 300 from step 0
Measures per budget: the branch against its scratch run (the same run, so the difference should be 0
within float rounding: the report prints the largest over seeds), wsd against cosine (the paired mean and
sd over seeds, against the cosine runs' seed sd: does the schedule itself move the loss), and the cost in
steps (counted, never timed) of the ladder against independent runs.

Cost: 1,260 steps per seed (ladder 360, scratch 300, cosine 600) at the demo's size: about 3 minutes per
seed on 2 idle cores; run it niced on a shared machine.

    python benchmarks/wsd_branch.py --seeds 3 --out /tmp/wsd-branch
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from anatomy_cli.spec.config import RunConfig, TrainConfig
from anatomy_cli.spec.roles import ALL_ON
from anatomy_cli.store import runs
from anatomy_cli.sweep.plan import expand, load_spec
from anatomy_cli.training.branch import branch
from anatomy_cli.training.budgets import branch_config, budget_ladder
from anatomy_cli.training.run import train

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = (100, 200, 300)


def llama_end(seed: int, threads: int) -> RunConfig:
    """The demo's LLaMA end at `seed`, wsd with a 20 % decay, no samples."""
    spec = load_spec(ROOT / "experiments" / "demo.toml")
    cfg = next(p.config for p in expand(spec, seeds=1) if p.role == ALL_ON)
    t = TrainConfig.model_validate({**cfg.train.model_dump(), "schedule": "wsd", "decay_frac": 0.2, "sample_len": 0,
                                    "threads": threads})
    return cfg.model_copy(update={"seed": seed, "train": t})


def done(run_dir: Path, make) -> dict:
    """A finished run's summary, training it first unless it completed already (reruns skip)."""
    if runs.run_status(run_dir) == runs.COMPLETED:
        return runs.read_summary(run_dir)
    return make()


def one_seed(out: Path, seed: int, threads: int, log) -> dict:
    base = llama_end(seed, threads)
    ladder = budget_ladder(base, BUDGETS)
    folder = out / f"s{seed}"
    stable = folder / "ladder-300"
    rows = {"seed": seed, "ladder_steps": ladder.cost_steps, "independent_steps": ladder.independent_steps}
    rows["ladder"] = {300: done(stable, lambda: train(ladder.stable.config, stable))["best_val_loss"]}
    for b in ladder.runs[1:]:
        d = folder / f"ladder-{b.budget}"
        rows["ladder"][b.budget] = done(d, lambda b=b, d=d: branch(stable, b.config, d))["best_val_loss"]
    rows["scratch"] = {300: rows["ladder"][300]}
    for budget in BUDGETS[:-1]:
        d = folder / f"scratch-{budget}"
        rows["scratch"][budget] = done(d, lambda b=budget, d=d: train(branch_config(base, b), d))["best_val_loss"]
    rows["cosine"] = {}
    for budget in BUDGETS:
        wsd = branch_config(base, budget)
        cos = wsd.model_copy(update={"train": TrainConfig.model_validate({**wsd.train.model_dump(),
                                                                          "schedule": "cosine"})})
        d = folder / f"cosine-{budget}"
        rows["cosine"][budget] = done(d, lambda c=cos, d=d: train(c, d))["best_val_loss"]
    log(f"seed {seed}: {json.dumps(rows)}")
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = ["| budget | branch (mean) | scratch (mean) | max abs branch - scratch | cosine (mean) | wsd - cosine "
             "(mean +/- sd over seeds) | cosine seed sd |", "|---|---|---|---|---|---|---|"]
    for b in BUDGETS:
        br = [r["ladder"][b] for r in rows]
        sc = [r["scratch"][b] for r in rows]
        co = [r["cosine"][b] for r in rows]
        d = [x - y for x, y in zip(br, co)]
        sd = statistics.stdev(d) if len(d) > 1 else math.nan
        lines.append(f"| {b} | {statistics.mean(br):.4f} | {statistics.mean(sc):.4f} | "
                     f"{max(abs(x - y) for x, y in zip(br, sc)):.2e} | {statistics.mean(co):.4f} | "
                     f"{statistics.mean(d):+.4f} +/- {sd:.4f} | "
                     f"{statistics.stdev(co) if len(co) > 1 else math.nan:.4f} |")
    r = rows[0]
    lines.append(f"\nsteps per seed: ladder {r['ladder_steps']} (stable 300 + decays), independent wsd runs "
                 f"{r['independent_steps']}: {r['ladder_steps'] / r['independent_steps']:.2f}x of independent, "
                 f"{r['ladder_steps'] / BUDGETS[-1]:.2f}x one 300-step run")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (1: polite on a shared machine)")
    p.add_argument("--out", type=Path, default=Path("/tmp/wsd-branch"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - t0:.0f} s] {text}", file=sys.stderr, flush=True)

    rows = [one_seed(args.out, args.first_seed + i, args.threads, log) for i in range(args.seeds)]
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
