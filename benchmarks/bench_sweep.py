"""Sweep wall time: the same plan run sequentially (1 x 1 thread), 1 worker x 2 threads, 2 workers x 1 thread.

Runs a small one-at-a-time sweep (by default 4 runs of the five-flips sizes, 150 steps each, on the
embedded corpus) into two fresh temporary folders through anatomy_cli.sweep.plan.execute, once per
layout, and prints the wall times and their ratio (parallel / sequential), plus whether the two
layouts produced identical metrics (they must: results do not depend on the thread count).
This is the measurement behind sweep.plan.core_workers (one worker per core, one thread each).

    python benchmarks/bench_sweep.py                 # ~2-3 minutes on 2 cores
    python benchmarks/bench_sweep.py --runs 8 --steps 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from anatomy_cli.spec.config import AblationSpec, validate  # noqa: E402
from anatomy_cli.store import runs  # noqa: E402
from anatomy_cli.sweep.plan import execute, expand  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=4, help="number of runs (configs of the list design)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--cores", type=int, default=2, help="cores to fill: 1 x N threads vs N x 1 thread")
    p.add_argument("--no-append", action="store_true")
    return p.parse_args(argv)


def make_spec(n_runs: int, steps: int) -> AblationSpec:
    spec_path = Path(__file__).resolve().parents[1] / "experiments" / "five-flips.toml"
    from anatomy_cli.spec.config import load_toml

    data = load_toml(spec_path)
    data.update(name="bench-sweep", design="list", seeds=1,
                configs=[{"name": f"c{i}", "set": {"seed": 1000 + i}} for i in range(n_runs)])
    data.pop("flips", None)
    data["base"]["train"].update(steps=steps, eval_interval=max(1, steps // 3), sample_len=0)
    return validate(AblationSpec, data)


def timed(plan, workers: int, threads: int) -> tuple[float, Path]:
    folder = Path(tempfile.mkdtemp(prefix=f"bench-sweep-{workers}x{threads}-"))
    plan = [p.__class__(p.run_id, p.slug, p.role, p.flip,
                        p.config.model_copy(update={"train": p.config.train.model_copy(update={"threads": threads})}))
            for p in plan]
    t0 = time.perf_counter()
    execute(plan, folder, workers=workers)
    return time.perf_counter() - t0, folder


def metrics(folder: Path) -> dict:
    return {d.name: [{k: v for k, v in r.items() if k not in runs.TIMING_KEYS} for r in runs.read_metrics(d)]
            for d in sorted(folder.iterdir()) if d.is_dir()}


def main(argv=None) -> None:
    args = parse_args(argv)
    plan = expand(make_spec(args.runs, args.steps))
    one_s, one_dir = timed(plan, 1, 1)
    seq_s, seq_dir = timed(plan, 1, args.cores)
    par_s, par_dir = timed(plan, args.cores, 1)
    same = metrics(seq_dir) == metrics(par_dir) == metrics(one_dir)
    lines = common.table(
        ["layout", "wall s", "runs", "steps/run"],
        [["1 worker x 1 thread (sequential)", f"{one_s:.1f}", args.runs, args.steps],
         [f"1 worker x {args.cores} threads", f"{seq_s:.1f}", args.runs, args.steps],
         [f"{args.cores} workers x 1 thread", f"{par_s:.1f}", args.runs, args.steps]],
    )
    lines += ["", f"{args.cores} parallel runs / sequential (1 thread each): **{par_s / one_s:.2f}x**; "
                  f"{args.cores} workers x 1 thread / 1 worker x {args.cores} threads: **{par_s / seq_s:.2f}x**; "
                  f"identical metrics across all three: {same}"]
    common.publish("bench_sweep: 1 x N threads vs N workers x 1 thread", lines, not args.no_append)


if __name__ == "__main__":
    main()
