"""What the default study costs: the demo (demo.toml, 3 seeds) against five-flips.toml at 1 seed.

The issue's bound: `make demo` trains 3 seeds in at most 1.5x the time one seed of the old default
(five-flips.toml, 800 steps) takes on this machine. Both studies are planned by sweep.plan.load_plan and
run by sweep.plan.execute (the product's executor: process start, data, every evaluation, the final
sample, checkpoints), each into a fresh temporary folder, in rounds that alternate which goes first
so a burst of load from other processes hits both alike. Each round prints demo / five-flips.

Restricted to keep it affordable on a loaded 2-core machine: the same configs of both studies
(default: the LLaMA end, five-flips' seed 1337 against the demo's three seeds), one worker each.
The two specs share every size, so a config's step time is the same in both and the ratio differs
between configs only through the fixed per-run cost (start-up, final sample), which weighs most on
the fastest config: the LLaMA end's ratio is the highest of the twelve, an upper bound for the study.

Scaled (--scale F < 1, when the machine is too loaded for full-size rounds): both studies' steps,
warmup, evaluation interval, evaluation batches and sample length are multiplied by F alike, so
every cost that grows with the budget shrinks in proportion and the number of evaluations stays;
only the fixed start of a run (data, model) does not shrink, and it weighs more on the demo's three
runs, so the scaled ratio is an upper bound of the full-size one.

    python benchmarks/bench_demo.py                    # ~5 minutes a round on 2 idle cores
    python benchmarks/bench_demo.py --scale 0.1        # a tenth of the budget, on a loaded machine
    python benchmarks/bench_demo.py --configs llama,2017 --rounds 3

--whole times what a newcomer waits for: `anatomy ablate` on the demo spec exactly as `make demo` runs it
(its rounds, every run, the report), in a fresh folder, in a process of its own, once; it records the wall
time in minutes with the load average before and after (run it on an idle machine: nothing else running).

    python benchmarks/bench_demo.py --whole            # ~10-15 minutes on 2 idle cores
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from anatomy_cli.sweep.plan import execute, load_plan  # noqa: E402

EXPERIMENTS = common.REPO_ROOT / "experiments"
STUDIES = {"five-flips": (EXPERIMENTS / "five-flips.toml", 1), "demo": (EXPERIMENTS / "demo.toml", None)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="llama", help="config slugs run in both studies, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--scale", type=float, default=1.0, help="multiply both budgets by this (an upper bound below 1)")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--whole", action="store_true", help="time `anatomy ablate` on the demo spec, as make demo runs it")
    return p.parse_args(argv)


def whole(append: bool) -> None:
    """`anatomy ablate` (the demo, as `make demo` runs it) once in a fresh folder: its wall time in minutes."""
    import json
    import subprocess

    folder = Path(tempfile.mkdtemp(prefix="bench-demo-whole-"))
    before = os.getloadavg()
    try:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "anatomy_cli", "ablate", "--runs-dir", str(folder)],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = os.getloadavg()
        if done.returncode != 0:
            sys.exit(f"bench_demo --whole: anatomy ablate exited {done.returncode}: {done.stderr[-2000:]}")
        record = json.loads((folder / "demo" / "decide.json").read_text())
        summaries = [json.loads(p.read_text()) for p in (folder / "demo").glob("*/summary.json")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rounds = ", ".join(f"{r['seeds']} seeds: {r['trained']} runs in {r['seconds'] / 60:.1f} min"
                       for r in record["rounds"])
    lines = [f"- `anatomy ablate` (experiments/demo.toml, as `make demo` runs it), one process, {os.cpu_count()} "
             f"cores; load average {before[0]:.2f} before, {after[0]:.2f} after (1 min)",
             f"- {len(summaries)} runs ({sum(s.get('status') == 'completed' for s in summaries)} completed); "
             f"rounds: {rounds}; stopped: {record.get('stopped')}",
             "", f"make demo's study, start to report: **{wall / 60:.1f} min** ({wall:.0f} s)"]
    common.publish("bench_demo --whole: make demo's wall time", lines, append)


SCALED = ("steps", "warmup", "eval_interval", "eval_batches", "sample_len")


def scaled(run, f: float):
    """The planned run with its budget's every part multiplied by f (at least 1 each)."""
    if f == 1.0:
        return run
    train = run.config.train
    train = train.model_copy(update={k: max(1, round(getattr(train, k) * f)) for k in SCALED})
    return dataclasses.replace(run, config=run.config.model_copy(update={"train": train}))


def plans(slugs: list[str], f: float) -> dict[str, list]:
    """Each study's planned runs of those configs (five-flips at 1 seed, the demo at its spec's seeds)."""
    out = {}
    for name, (path, seeds) in STUDIES.items():
        out[name] = [scaled(p, f) for p in load_plan(path, seeds=seeds)[1] if p.slug in slugs]
        if not out[name]:
            sys.exit(f"bench_demo: no config named {','.join(slugs)} in {path.name}")
    return out


def timed(plan, workers: int) -> tuple[float, str]:
    folder = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    load = f"{os.getloadavg()[0]:.1f}"
    try:
        t0 = time.perf_counter()
        summaries = execute(plan, folder / "study", workers=workers)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    bad = [s.get("run_id") for s in summaries if s.get("status") != "completed"]
    if bad:
        sys.exit(f"bench_demo: runs did not complete: {bad}")
    return wall, load


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.whole:
        return whole(not args.no_append)
    slugs = [s.strip() for s in args.configs.split(",") if s.strip()]
    studies = plans(slugs, args.scale)
    rows, ratios = [], []
    for r in range(args.rounds):
        order = list(studies) if r % 2 == 0 else list(reversed(studies))
        wall, load = {}, {}
        for name in order:
            wall[name], load[name] = timed(studies[name], args.workers)
            print(f"round {r + 1}: {name} {wall[name]:.1f} s (load {load[name]})", flush=True)
        ratios.append(wall["demo"] / wall["five-flips"])
        rows.append([r + 1, " then ".join(order), f"{wall['five-flips']:.1f}", load["five-flips"],
                     f"{wall['demo']:.1f}", load["demo"], f"{ratios[-1]:.2f}"])
    five, demo = (studies[n][0].config.train for n in ("five-flips", "demo"))
    lines = [f"- configs: {', '.join(slugs)}; five-flips: {len(studies['five-flips'])} run(s) x {five.steps} steps "
             f"(eval every {five.eval_interval} over {five.eval_batches} batches); "
             f"demo: {len(studies['demo'])} runs x {demo.steps} steps "
             f"(eval every {demo.eval_interval} over {demo.eval_batches} batches); {args.workers} worker(s); "
             f"budget scale {args.scale:g}" + (" (an upper bound of the full-size ratio)" if args.scale < 1 else ""),
             ""]
    lines += common.table(["round", "order", "five-flips s", "load", "demo s", "load", "demo / five-flips"], rows)
    lines += ["", f"demo (3 seeds) / five-flips (1 seed), median over {len(ratios)} rounds: "
                  f"**{statistics.median(ratios):.2f}x** (the issue's bound: 1.5x)"]
    common.publish("bench_demo: the default study at 3 seeds against five-flips at 1 seed", lines, not args.no_append)


if __name__ == "__main__":
    main()
