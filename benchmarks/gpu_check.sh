#!/usr/bin/env bash
# gpu_check.sh: anatomy on a CUDA machine, in under 5 minutes (hard `timeout`, every loop bounded).
#   1. correctness: cached vs full logits on CUDA, anatomy vs the hand-written reference, which SDPA
#      kernels anatomy's attention can use, one short training run through anatomy_cli.training.run.train
#      (device cuda) on generated text
#   2. seed-config step time: eager fp32+TF32, eager bf16, compiled bf16, compiled reduce-overhead
#   3. MFU of a GPT-2-small-sized char model (bf16 + compile) against --peak-tflops (default 790)
#
# Needs on that machine: python3 with a CUDA build of torch >= 2.5, numpy, safetensors, and
# pydantic >= 2.6 (+ pydantic-core, annotated-types, typing-inspection): anatomy's config.py imports
# pydantic. (typer, rich, pandas, matplotlib are not used by this check.) anatomy need not be
# installed: it runs from src/ via PYTHONPATH. With no package registry there, carry pydantic as
# wheels: on a machine with a registry, in the repo root (match the target's Python version):
#     python3 -m pip download --only-binary=:all: --platform manylinux2014_x86_64 \
#         --python-version 3.12 --implementation cp -d .whl "pydantic>=2.6,<3"
# and carry .whl/ (git-ignored) along; this script installs from it with `pip --no-index` when
# pydantic is not importable. Without it, the script stops with a clear message (exit 3).
#
# Usage:  benchmarks/gpu_check.sh [gpu_check.py run options]
#         e.g. benchmarks/gpu_check.sh --peak-tflops 790 --json "$OUT/gpu_check.json"
# Env:    PYTHON (default python3), GPU_CHECK_TIMEOUT (seconds, default 290)
# Exit:   0 passed, 1 a check failed, 2 no CUDA device, 3 missing Python packages, 124 timed out.
set -uo pipefail

NAME=gpu_check
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
install_missing "pydantic:pydantic>=2.6,<3"
DEVICE="$(device_arg "$@")"   # `--device cpu --tiny` (a CPU smoke test of this script) skips the CUDA requirement
"$PY" "$HERE/gpu_check.py" preflight --device "$DEVICE" || exit $?   # 3: missing packages, 2: no CUDA

timeout --signal=INT --kill-after=15 "${GPU_CHECK_TIMEOUT:-290}" "$PY" "$HERE/gpu_check.py" run "$@"
status=$?
[ "$status" -eq 124 ] && echo "gpu_check: stopped by the ${GPU_CHECK_TIMEOUT:-290} s timeout" >&2
exit "$status"
