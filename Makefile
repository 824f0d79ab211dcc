# Every target creates the virtual environment in the checkout on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CUDA builds of torch bring the Triton they need; with a CPU build, this one is installed so the
# tests run the GPU kernels under Triton's interpreter and compile them for the GPU.
TRITON := triton==3.9.0
# numba's OpenMP layer kills forked DataLoader workers; workqueue is fork-safe.
export NUMBA_THREADING_LAYER ?= workqueue

.PHONY: venv train test test-fast lint bench gpu-check clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -c "import triton" 2>/dev/null || $(PY) -m pip install -q $(TRITON)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/lightning-gtn-train $(ARGS)

# Two pytest-xdist workers; before they start, tests/conftest.py compiles the numba kernels once
# (tests/_warmup.py), so the workers load them from numba's cache. About 7 min on an idle 2-core
# machine (28 measured on a busy one); test-fast leaves out the tests marked slow.
test: $(STAMP)
	$(PY) -m pytest -n 2 --timeout 900 -q $(ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow" $(ARGS)

# ruff (lint and format, configured in pyproject.toml) and mypy (the package, [tool.mypy]): no findings
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/run_all.py $(ARGS)

# On a machine with a CUDA GPU, in at most 10 minutes: the CUDA and Triton tests, the GPU
# tables (CTC, RNN-T, MMI), torch.compile of a CTC step and short GPU training runs, each part
# with its own time budget, all in one report ($OUT/gpu_check.md, else benchmarks/GPU_RESULTS.md).
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun lightning_logs .pytest_cache .hypothesis .mypy_cache .ruff_cache
