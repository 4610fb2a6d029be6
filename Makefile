# Set-up and everyday commands. Everything installs into .venv; torch is installed first and pinned
# (TORCH=...) so pip never swaps in a different build behind your back.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,hf,dask,tb,data
BIN    := $(VENV)/bin

.PHONY: demo test check results install clean

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

# The test suite (CPU, toy sizes).
test: install
	$(BIN)/python -m pytest -q

# The CI regression gate on best val loss (see experiments/ci-regression.toml).
check: install
	$(BIN)/anatomy check experiments/ci-regression.toml --baseline experiments/ci-baseline.json

# Rewrite the README's marked result blocks from experiments/results/*.json (written by
# `anatomy report RUNS_DIR --results experiments/results/STUDY.json`).
results: install
	$(BIN)/python -m anatomy_cli.results README.md

clean:
	rm -rf $(VENV) runs .pytest_cache
