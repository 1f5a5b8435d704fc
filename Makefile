# gpuops — one entry point for set-up, tests and the demo.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Python's bytecode caches are written: some machines set PYTHONDONTWRITEBYTECODE, and then every
# gpuops process the tests start (~600) compiled the modules it imports again, and every pytest
# worker rewrote every test module's asserts again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: all venv native test-deps test test-deep lint typecheck compat pytest demo gpu-test clean

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

native:
	@if [ -f native/Makefile ]; then $(MAKE) -s -C native; fi

LINTED := $(wildcard gpuops tests bench plugins)

lint: venv
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/lint-imports --no-cache

typecheck: venv
	$(BIN)/mypy gpuops/core gpuops/node gpuops/attributors.py gpuops/spec gpuops/fleet gpuops/cli gpuops/tui gpuops/plan gpuops/tenancy gpuops/views gpuops/exporter gpuops/simfleet

# core/ and node/ run on GPU nodes with old Pythons: they must stay valid Python 3.8.
compat: venv
	$(BIN)/vermin --no-tips --violations -t=3.8- --eval-annotations gpuops/core gpuops/node

# Debian packages the real-SSH tests need (openssh-server, iproute2, tmux); fast when present.
test-deps:
	@bash scripts/install-test-deps.sh

# Tests marked serial (shares of GPU time, timings against the clock) run first, alone, on a
# machine nothing else of the suite has touched yet. Then the rest in parallel (pytest-xdist):
# most of it waits on servers, SSH and subprocesses, so more workers than cores. With
# --dist loadgroup, tests/conftest.py keeps the tests of a module that uses a module-scoped
# fixture (a simulated fleet, a Prometheus) on one worker, so it starts once; it also puts the tests
# marked slow first, and --no-loadscope-reorder keeps that order (xdist would put the biggest
# groups first), so the longest start at once and the rest fill the cores around them.
# --durations: the CI log names the slowest tests (the run must stay under 9 minutes on 2 cores;
# docs/testing.md, "Time").
PYTEST_WORKERS ?= 4
pytest: venv native test-deps
	$(BIN)/python -m pytest -q -m "serial and not gpu" -p no:xdist --durations=10
	$(BIN)/python -m pytest -q -m "not gpu and not serial" -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25

test: venv native lint typecheck compat pytest

# The longer property search, apart from make test: every hypothesis test at four times its
# count, drawn anew (tests/hypothesis_budget.py).
test-deep: venv native
	GPUOPS_HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest -q -m hypothesis -n $(PYTEST_WORKERS)

# A simulated fleet over real SSH on loopback, opened in the TUI; the fleet stops when it closes.
demo: venv native
	$(BIN)/gpuops demo

# GPU machines are often offline (the lent ones are): this runs this checkout's venv once `make venv`
# has set it up, else the machine's python3 (which may be the one with PyTorch and pytest), with the
# checkout on PYTHONPATH. GPUOPS_GPU_RESULTS=DIR keeps the figures as JSON. See docs/limiter.md.
GPU_PYTHON ?= $(if $(wildcard $(STAMP)),$(BIN)/python,python3)

gpu-test: native
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then \
		echo "gpu-test: no NVIDIA GPU on this machine; nothing to run (exit 0)"; exit 0; fi; \
	set -x; PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m pytest -q -m gpu $(PYTEST_ARGS) tests/gpu

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	@if [ -f native/Makefile ]; then $(MAKE) -s -C native clean; fi
