#!/usr/bin/env bash
# gpu_sweep.sh: the five-flips study at the corpus articles' settings (experiments/five-flips-seed.toml:
# 12 configs x 2000 steps) on one CUDA GPU with --compile, at --workers 1 and at the best N
# (anatomy's default from free memory and model size), all within a hard 8-minute `timeout`.
# Prints each pass's wall time, aggregate tokens/s and best val losses, and checks that the two
# passes' best val losses agree (gpu_sweep.py: --tol, default 0.005).
#
# Needs on that machine: python3 with a CUDA build of torch and what `anatomy ablate` imports:
# numpy, pydantic >= 2.6, typer, rich, safetensors, pandas, matplotlib, tabulate. anatomy need not
# be installed: it runs from src/ via PYTHONPATH. Whatever is missing is installed, with no network,
# from wheels carried in .whl/ (git-ignored), downloaded beforehand on a machine with a registry
# (match the target's Python version; the H200 image lacks only pydantic):
#     python3 -m pip download --only-binary=:all: --platform manylinux2014_x86_64 \
#         --python-version 3.12 --implementation cp -d .whl "pydantic>=2.6,<3"
# Without them the script stops with a message naming what is missing (exit 3).
#
# Usage:  benchmarks/gpu_sweep.sh [gpu_sweep.py run options]
#         e.g. benchmarks/gpu_sweep.sh --json "$OUT/gpu_sweep.json"
#         the seeds study (12 configs x 5 seeds, alone vs stacked): benchmarks/gpu_sweep.sh --seeds 5
#         CPU smoke test of the script: benchmarks/gpu_sweep.sh --device cpu --tiny --no-compile [--seeds 2]
# Env:    PYTHON (default python3), GPU_SWEEP_TIMEOUT (seconds for everything, default 480)
# Exit:   0 passed, 1 a run failed or the passes disagree, 2 no CUDA device, 3 missing packages,
#         4 or 124 out of time.
set -uo pipefail

NAME=gpu_sweep
LIMIT="${GPU_SWEEP_TIMEOUT:-480}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
# everything `anatomy ablate` imports besides torch
install_missing "numpy:numpy" "pydantic:pydantic>=2.6,<3" "typer:typer>=0.12" "rich:rich>=13" \
    "safetensors:safetensors>=0.4" "pandas:pandas>=2.0" "matplotlib:matplotlib>=3.7" "tabulate:tabulate>=0.9"
DEVICE="$(device_arg "$@")"
"$PY" "$HERE/gpu_sweep.py" preflight --device "$DEVICE" || exit $?   # 3: missing packages, 2: no CUDA

left=$((LIMIT - SECONDS))   # the install and preflight count against the 8 minutes too
[ "$left" -lt 60 ] && { echo "gpu_sweep: only ${left} s left of ${LIMIT} s" >&2; exit 4; }
timeout --signal=INT --kill-after=15 "$left" "$PY" "$HERE/gpu_sweep.py" run --budget $((left - 20)) "$@"
status=$?
[ "$status" -eq 124 ] && echo "gpu_sweep: stopped by the ${LIMIT} s timeout" >&2
exit "$status"
