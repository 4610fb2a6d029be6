"""Stacked seeds against runs alone: the default study (experiments/five-flips.toml) with its seeds,
trained by `anatomy ablate` itself with --stack N and with --stack off, in alternating rounds.

Each round runs the whole sweep into a fresh folder, once per mode, in an order that alternates
between rounds (off, N / N, off / ...), so a load change on a shared machine hits both; the ratio
off / stacked is paired within a round and its median over rounds is the verdict. Wall time is the
CLI's, start-up, evaluations, samples and the process pool included (--no-report: no report).
The load average before and after is printed: other work on the machine slows both modes.

    python benchmarks/bench_stack.py                              # 12 configs x 3 seeds, 100 steps, 2 rounds
    python benchmarks/bench_stack.py --steps 60 --rounds 3 --stack 3
    python benchmarks/bench_stack.py --spec tiny.toml --steps 4 --rounds 1 --no-append   # smoke (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ANATOMY = str(Path(sys.executable).parent / "anatomy")  # the installed CLI, next to this interpreter


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=str(ROOT / "experiments" / "five-flips.toml"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--stack", type=int, default=3, help="seeds per stacked model")
    p.add_argument("--flip", default=None, help="only these flips (a smaller study)")
    p.add_argument("--no-append", action="store_true")
    return p.parse_args(argv)


def sweep(args, stack: str, runs_dir: Path) -> float:
    """Wall seconds of one `anatomy ablate` of the study; raises if a run did not complete."""
    cmd = [ANATOMY, "ablate", args.spec, "--seeds", str(args.seeds), "--steps", str(args.steps), "--stack", stack,
           "--no-report", "--runs-dir", str(runs_dir), "--device", "cpu"] + (["--flip", args.flip] if args.flip else [])
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"bench_stack: `{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
    sizes = {json.loads(p.read_text()).get("stacked") for p in runs_dir.glob("*/*/summary.json")}
    want = {None} if stack == "off" else {min(int(stack), args.seeds)}
    if sizes != want:  # measure what the row says: every run stacked (or alone), none fell back
        raise SystemExit(f"bench_stack: --stack {stack} trained stacks of {sorted(sizes, key=str)}, not {want}")
    return wall


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.spec = str(Path(args.spec).resolve())
    on = str(args.stack)
    print(common.describe())
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {"off": [], on: []}
    with tempfile.TemporaryDirectory(prefix="bench-stack-") as tmp:
        for r in range(args.rounds):
            order = ["off", on] if r % 2 == 0 else [on, "off"]
            for mode in order:
                walls[mode].append(sweep(args, mode, Path(tmp) / f"r{r}-{mode}"))
            print(f"round {r + 1}: off {walls['off'][-1]:.1f} s, stack {on} {walls[on][-1]:.1f} s", flush=True)
    load_after = os.getloadavg()
    ratios = [a / b for a, b in zip(walls["off"], walls[on])]
    rows = [[f"--stack {m}", f"{common.median(w):.1f}", f"{common.spread(w):.1%}"] for m, w in walls.items()]
    verdict = (f"stacked ({on} seeds per model) is {common.median(ratios):.2f}x the speed of runs alone "
               f"(off/stacked wall, paired over {len(ratios)} rounds, spread {common.spread(ratios):.1%}); "
               f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    study = f"{Path(args.spec).name} x {args.seeds} seeds, {args.steps} steps"
    common.publish(f"bench_stack: stacked seeds vs alone, {study}",
                   [*common.table(["mode", "median wall s", "spread"], rows), "", verdict], not args.no_append)
    return {"ratios": ratios, "walls": walls}


if __name__ == "__main__":
    main()
