"""Shared helpers for the benchmarks: machine description, robust timing, matmul peak, results file.

Timings on a shared machine are noisy, so every measurement here is a median over several rounds
taken after warm-up, and A/B comparisons are interleaved (round r runs every variant once, in an
order rotated per round) so that a burst of load from another process hits all variants alike.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "RESULTS.md"

# Let `python benchmarks/x.py` import anatomy from the checkout even without an install.
if str(REPO_ROOT / "src") not in sys.path:
    sys.path.append(str(REPO_ROOT / "src"))


# --------------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What the numbers were measured on; `describe()` renders it on one line."""
    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        info["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    return info


def describe(info: dict | None = None) -> str:
    m = info or machine()
    parts = [f"{m['cpu']}, {m['cores']} cores ({m['affinity']} usable), torch {m['torch']}, "
             f"{m['threads']} threads, Python {m['python']}"]
    if "gpu" in m:
        parts.append(f"GPU {m['gpu']}")
    if "load" in m:
        parts.append(f"load avg {m['load']}")
    return "; ".join(parts)


def set_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)


# --------------------------------------------------------------------------------- timing


def _sync(device: str | torch.device | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], warmup: int = 2, repeats: int = 5, inner: int = 1,
            device=None) -> list[float]:
    """Seconds per call of fn: `repeats` samples, each the mean over `inner` calls, after warm-up."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / inner)
    return samples


def time_interleaved(fns: dict[str, Callable[[], object]], warmup: int = 2, repeats: int = 5,
                     inner: int = 1, device=None, budget_s: float | None = None,
                     min_rounds: int = 3) -> dict[str, list[float]]:
    """Seconds per call for each fn, A/B interleaved.

    Each fn is warmed up first; then round r runs every fn `inner` times, in an order rotated
    by r, so slow phases of a noisy machine are spread over all variants. Stops early (after at
    least `min_rounds` rounds) once `budget_s` of timed work is spent.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    _sync(device)
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[name]()
            _sync(device)
            samples[name].append((time.perf_counter() - t0) / inner)
        if budget_s is not None and r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
            break
    return samples


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> float:
    """Half the inter-quartile range relative to the median (0.05 = +-5%); 0 for < 4 samples."""
    if len(xs) < 4:
        return (max(xs) - min(xs)) / 2 / statistics.median(xs) if len(xs) > 1 else 0.0
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / 2 / statistics.median(xs)


# --------------------------------------------------------------------------------- matmul peak


def matmul_peak(sizes=(1024, 2048), dtype=torch.float32, device="cpu", repeats: int = 5) -> dict:
    """Best median GFLOP/s of an n x n x n matmul over `sizes`, in this process and thread count.

    This is the practical ceiling that the model's FLOP/s are compared against (an "MFU" against
    measured sgemm rather than the vendor's number, which a 2-core slice never reaches).
    """
    best = {"gflops": 0.0, "n": None, "by_n": {}}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        inner = max(1, int(4e9 // (2 * n**3)))  # ~4 GFLOP per sample
        secs = time_fn(lambda: torch.mm(a, b, out=out), warmup=2, repeats=repeats, inner=inner, device=device)
        gflops = 2 * n**3 / median(secs) / 1e9
        best["by_n"][n] = gflops
        if gflops > best["gflops"]:
            best.update(gflops=gflops, n=n)
    return best


# --------------------------------------------------------------------------------- reporting


def table(headers: list[str], rows: list[list[object]]) -> list[str]:
    """A GitHub markdown table as a list of lines (also readable in a terminal)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    fmt = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return [fmt(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(fmt(r) for r in cells)]


def command_line() -> str:
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(REPO_ROOT)
    except ValueError:
        pass
    return " ".join(["python", str(script), *sys.argv[1:]])


def append_results(section_title: str, command: str, lines: list[str], path: Path = RESULTS) -> Path:
    """Append a dated section (date, machine, torch, command, then `lines`) to RESULTS.md."""
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    head = "# anatomy benchmark results\n\nEach section is appended by one benchmark run (newest last).\n"
    body = [
        f"## {section_title}",
        "",
        f"- date: {now}",
        f"- machine: {describe()}",
        f"- torch: {torch.__version__}",
        f"- command: `{command}`",
        "",
        *lines,
        "",
    ]
    new = not path.exists()
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write(head + "\n")
        f.write("\n".join(body) + "\n")
    return path


def publish(section_title: str, lines: list[str], append: bool = True) -> None:
    """Print the result lines and, unless the script ran with --no-append, add them to RESULTS.md."""
    print("\n".join(lines))
    if append:
        append_results(section_title, command_line(), lines)
