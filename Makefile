# Every target creates the virtual environment in the checkout on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# numba's OpenMP layer kills forked DataLoader workers; workqueue is fork-safe.
export NUMBA_THREADING_LAYER ?= workqueue

.PHONY: venv train test test-fast bench clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/lightning-gtn-train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -n 2 --timeout 900 -q $(ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow" $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun lightning_logs .pytest_cache .hypothesis
