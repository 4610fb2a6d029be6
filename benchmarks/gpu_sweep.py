"""The five-flips study at the corpus articles' settings (corpus/anatomy.md) on one GPU, at --workers 1
and at the best N.

Run through benchmarks/gpu_sweep.sh, which installs carried wheels if needed and bounds everything
with `timeout`. Sub-commands:

    python benchmarks/gpu_sweep.py preflight                   # imports + CUDA; exit 3 / 2 with a message
    python benchmarks/gpu_sweep.py run [options]                # the study, twice (budget-bounded)
    python benchmarks/gpu_sweep.py run --device cpu --tiny --no-compile   # CPU smoke test of the script
    python benchmarks/gpu_sweep.py run --seeds 5                # the 12 x 5 seeds study: alone vs stacked

`run` drives the real CLI (`python -m anatomy_cli ablate SPEC --device D --compile --workers N`)
three times, all sharing one inductor cache (TORCHINDUCTOR_CACHE_DIR under the runs folder):
  0. warm-up: every config for 1 step at N = best, so every train and eval graph is compiled once
     and both measured passes load them from the cache (neither pays for cold compiles);
  1. N = 1: the 12 runs one after another, in one process;
  2. N = best: the 12 runs in N processes sharing the GPU (default: anatomy's own choice from free
     memory and the model size, devices.device_workers).
With --seeds S the two passes are instead the 12 configs x S seeds trained alone (N = best, compiled
as asked) and stacked (--stack S: each config's seeds as one batched model, eager, since compiled
runs train alone; ablate's own worker count); the warm-up's wall time is the cold start (compile).
For each pass it prints the wall time, the aggregate training tokens/s (all runs' tokens / wall
time of the pass) and every config's best val loss; then the two passes' best val losses side by
side. They must agree within --tol (default 0.005, check.MIN_TOLERANCE, about 1/8 of the seed-to-
seed std of the CI gate): compiled CUDA kernels may accumulate with atomics (inductor's scatter-add
in the embedding backward), so bit-identity is not promised; a larger gap means the concurrent runs
interfere. Exit status: 0 passed, 1 mismatch or a failed run, 2 no CUDA, 3 missing packages,
4 out of time (what finished is still printed).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPEC = ROOT / "experiments" / "five-flips-seed.toml"
EXIT_FAILED, EXIT_NO_CUDA, EXIT_MISSING, EXIT_TIME = 1, 2, 3, 4
REQUIRED = ["torch", "numpy", "pydantic", "typer", "rich", "safetensors", "pandas", "anatomy_cli.cli.main"]


def preflight(device: str, quiet: bool = False) -> int:
    import importlib

    missing = []
    for name in REQUIRED:
        try:
            importlib.import_module(name)
        except Exception as err:  # ImportError, or whatever a broken package raises
            missing.append(f"{name}: {err.__class__.__name__}: {err}")
    if missing:
        print("gpu_sweep: missing Python packages:\n  - " + "\n  - ".join(missing), file=sys.stderr)
        print("carry them as wheels in .whl/ (see benchmarks/README.md, gpu_sweep.sh)", file=sys.stderr)
        return EXIT_MISSING
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_sweep: no CUDA device (torch {torch.__version__}); nothing to run. "
              "CPU smoke test: gpu_sweep.py run --device cpu --tiny", file=sys.stderr)
        return EXIT_NO_CUDA
    if not quiet:
        print(f"gpu_sweep preflight ok: torch {torch.__version__}, "
              f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    return 0


def best_workers(args, spec: Path) -> int:
    """anatomy's own default for this plan and device (what `ablate` picks without --workers)."""
    from anatomy_cli.sweep.plan import check_data, load_plan, plan_workers

    _, plan = load_plan(spec, seeds=args.seeds, steps=args.steps, device=args.device, compile=args.compile or None)
    return plan_workers(plan, check_data(plan))


def ablate(spec: Path, runs_dir: Path, workers: int | None, steps: int | None, args, deadline: float,
           stack: str = "off") -> dict:
    """One `anatomy ablate` pass in a subprocess; its wall time and every run's summary. workers None:
    ablate's own default. A stacked pass trains eagerly: compiled runs train alone (training/stacked.py)."""
    compile_ = args.compile and stack == "off"
    cmd = [sys.executable, "-m", "anatomy_cli", "ablate", str(spec), "--device", args.device, "--stack", stack,
           "--runs-dir", str(runs_dir), "--no-report"] + ["--compile"] * compile_
    cmd += ["--workers", str(workers)] if workers else []
    cmd += ["--seeds", str(args.seeds)] if args.seeds else []
    if steps is not None:
        cmd += ["--steps", str(steps)]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()))
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = None, "timed out"
    wall = time.perf_counter() - t0
    summaries = {}
    for path in sorted(runs_dir.glob("*/*/summary.json")):
        s = json.loads(path.read_text())
        config = json.loads((path.parent / "config.json").read_text())
        summaries[f"{config['name'].rsplit('/', 1)[-1]}/s{config['seed']}"] = s
    return {"workers": workers, "rc": rc, "wall_s": wall, "tail": tail, "runs": summaries,
            "tokens": sum(s.get("tokens_seen") or 0 for s in summaries.values())}


def show(p: dict, label: str) -> None:
    ok = [s for s in p["runs"].values() if s.get("status") == "completed"]
    rate = p["tokens"] / p["wall_s"] if p["wall_s"] else 0.0
    p["tokens_per_s"] = rate
    print(f"\n== {label}: N = {p['workers'] or 'ablate default'}: {len(ok)}/{len(p['runs'])} runs completed in "
          f"{p['wall_s']:.1f} s wall; "
          f"aggregate {rate / 1e6:.3f} M tokens/s ({p['tokens']:,} tokens)", flush=True)
    if p["rc"] != 0:
        print(f"   ablate exit status {p['rc']}:\n{p['tail']}", flush=True)
    for slug, s in p["runs"].items():
        tps = s.get("tokens_per_s") or 0.0
        print(f"   {slug:22s} {s.get('status', '?'):10s} stack {s.get('stacked') or 1}  "
              f"best val {s.get('best_val_loss') or float('nan'):.5f} "
              f"@ {s.get('best_step')}  {tps / 1e6:6.3f} M tok/s (own)  matmul {s.get('matmul_precision')}  "
              f"sdpa {s.get('sdpa_kernel')}  peak {(s.get('peak_mem_bytes') or 0) / 2**20:,.0f} MiB", flush=True)


def compare(one: dict, best: dict, tol: float, title: str) -> tuple[bool, float]:
    print(f"\n== best val loss, {title} (tolerance {tol:g})")
    worst, ok = 0.0, True
    for slug in one["runs"]:
        a = one["runs"][slug].get("best_val_loss")
        b = best["runs"].get(slug, {}).get("best_val_loss")
        if a is None or b is None:
            print(f"   {slug:16s} missing ({a}, {b})")
            ok = False
            continue
        worst = max(worst, abs(a - b))
        print(f"   {slug:16s} {a:.6f} {b:.6f}  delta {b - a:+.2e}{'  identical' if a == b else ''}")
    ok = ok and len(one["runs"]) == len(best["runs"]) > 0 and worst <= tol
    print(f"   max |delta| {worst:.2e}: {'PASS' if ok else 'FAIL'}")
    return ok, worst


def run(args) -> int:
    code = preflight(args.device, quiet=True)
    if code:
        return code
    deadline = time.monotonic() + args.budget
    root = Path(args.runs_dir or tempfile.mkdtemp(prefix="anatomy-gpu-sweep-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str((root / "compile-cache").resolve())  # one cache, all passes
    steps = 2 if args.tiny else args.steps
    n = args.workers or best_workers(args, args.spec)
    print(f"gpu_sweep: spec {args.spec.name}, device {args.device}, steps {steps or 'spec'}, best N = {n} "
          f"({'--workers' if args.workers else 'anatomy default'}), runs in {root}, budget {args.budget:.0f} s",
          flush=True)
    result = {"spec": args.spec.name, "device": args.device, "best_workers": n, "passes": {}}
    if not args.no_warmup:
        warm = ablate(args.spec, root / "warm", n, 1, args, deadline)
        print(f"warm-up (1 step each, compiles every graph once): {warm['wall_s']:.1f} s, exit {warm['rc']}",
              flush=True)
    # --seeds: the seeds study, every run alone (N = best) against the seeds of each config stacked
    # (ablate's own worker count); else the worker study, N = 1 against N = best, runs alone.
    plan = ((("alone", n, "off"), ("stacked", None, str(args.seeds))) if args.seeds
            else (("sequential", 1, "off"), ("concurrent", n, "off")))
    passes = {}
    for label, workers, stack in plan:
        if time.monotonic() >= deadline:
            break
        passes[label] = ablate(args.spec, root / label, workers, steps, args, deadline, stack)
        show(passes[label], label)
    ok = len(passes) == 2
    if ok:
        (a, pa), (b, pb) = passes.items()
        ok, worst = compare(pa, pb, args.tol, f"{a} vs {b}")
        speed = pb["tokens_per_s"] / max(pa["tokens_per_s"], 1e-9)
        print(f"\naggregate tokens/s, {b} over {a}: {speed:.2f}x; wall {pa['wall_s']:.1f} s -> {pb['wall_s']:.1f} s")
        result |= {"max_abs_delta": worst, "tolerance": args.tol, "speedup": speed}
    out_of_time = time.monotonic() >= deadline or any(p["rc"] is None for p in passes.values())
    failed = any(p["rc"] not in (0, None) for p in passes.values())
    result["passes"] = {k: {kk: v for kk, v in p.items() if kk != "tail"} for k, p in passes.items()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if out_of_time:
        print("gpu_sweep: out of time budget", file=sys.stderr)
        return EXIT_TIME
    return 0 if ok and not failed else EXIT_FAILED


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pre = sub.add_parser("preflight")
    pre.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r = sub.add_parser("run")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--spec", type=Path, default=SPEC)
    r.add_argument("--steps", type=int, default=None, help="override the spec's 2000 steps")
    r.add_argument("--workers", type=int, default=None, help="the concurrent N (default: anatomy's choice)")
    r.add_argument("--seeds", type=int, default=None,
                   help="the seeds study: each config x SEEDS, alone vs stacked (--stack SEEDS, eager)")
    r.add_argument("--tol", type=float, default=0.005, help="allowed |best val loss N=1 - N=best|")
    r.add_argument("--budget", type=float, default=450.0, help="seconds for all passes")
    r.add_argument("--runs-dir", type=Path, default=None, help="default: a new temp folder")
    r.add_argument("--no-warmup", action="store_true")
    r.add_argument("--no-compile", dest="compile", action="store_false", help="eager (CPU smoke test)")
    r.add_argument("--tiny", action="store_true", help="2 steps per run (CPU smoke test of the script)")
    r.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cmd == "preflight":
        return preflight(args.device)
    return run(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
