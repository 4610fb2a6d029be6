# Set-up and everyday commands. Everything installs into .venv; torch is installed first and pinned
# (TORCH=...) so pip never swaps in a different build behind your back.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,hf,dask,tb,data
BIN    := $(VENV)/bin

.PHONY: demo test test-fast test-kernels lint check results install clean

$(BIN)/anatomy: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	@touch $@

install: $(BIN)/anatomy

# The main job: the demo study (experiments/demo.toml: the five flips, 3 seeds, 300 steps) on the
# embedded corpus, then its verdict and report (runs/demo/report).
demo: install
	$(BIN)/anatomy ablate

# The whole test suite (CPU, toy sizes), the 20 slowest tests listed at the end.
test: install
	$(BIN)/python -m pytest -q --durations=20

# The unit lane, for the edit-test loop: every test neither marked slow nor starting a process
# (subprocess, spawned worker, Dask cluster; see the markers in pyproject.toml).
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not process"

# The numerics-heavy tests again on other kernel paths, so a test that holds on one CPU's rounding only
# fails here too: each ATen CPU capability below this machine's (default; avx2 under AVX-512) and MKL's
# COMPATIBLE conditional-numerical-reproducibility mode (the path MKL takes on neither vendor's fast code).
KERNEL_TESTS ?= tests/model/test_lm.py tests/model/test_rows.py tests/model/test_kv_cache.py \
	tests/model/test_reference.py tests/training/test_stacked.py tests/model/test_mla.py tests/model/test_moe.py \
	tests/model/test_gdn.py tests/model/test_swa.py tests/model/test_modern.py tests/model/test_mixers.py \
	tests/exams/test_export.py
test-kernels: install
	@set -e; for lane in $$($(BIN)/python -c "import torch; c = torch.backends.cpu.get_cpu_capability(); \
	    print(*['ATEN_CPU_CAPABILITY=' + l for l in ['default', 'avx2'][: {'AVX512': 2, 'AVX2': 1}.get(c, 1)]], \
	    'MKL_CBWR=COMPATIBLE')"); do \
	  echo "== $$lane"; env $$lane $(BIN)/python -m pytest -q -p no:cacheprovider $(KERNEL_TESTS); done

# Lint (pycodestyle errors and warnings, pyflakes, import order: pyproject.toml's [tool.ruff]).
lint: install
	$(BIN)/ruff check src tests benchmarks

# The CI regression gate on best val bits per byte (see experiments/ci-regression.toml).
check: install
	$(BIN)/anatomy check experiments/ci-regression.toml --baseline experiments/ci-baseline.json

# Rewrite the README's and docs/' marked result blocks from experiments/results/*.json (written by
# `anatomy report RUNS_DIR --results experiments/results/STUDY.json`).
results: install
	$(BIN)/anatomy results README.md docs/*.md

clean:
	rm -rf $(VENV) runs .pytest_cache
