# litlab: `make train` and `make test` are all a new user needs; both create .venv if missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install train test test-fast lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

install: $(STAMP)  ## create .venv and install litlab with its test tools

train: install  ## train the default CNN on the embedded digits (add ARGS="key=value ...")
	$(BIN)/python train.py $(ARGS)

# pytest processes side by side (pytest-xdist): the suite's tests wait on processes, files and
# Python more than on arithmetic, so two share two cores well (CI: 2 cores); JOBS=0: one process.
# worksteal: a process that runs out of tests takes half of another's queue (the slow tier,
# first in the order, would otherwise end the run on one process while the other idles).
JOBS ?= 2
XDIST = -n $(JOBS) --dist worksteal

test: install  ## the whole suite (GPU tests skip themselves without CUDA)
	$(BIN)/python -m pytest $(XDIST) $(ARGS)

test-fast: install  ## the suite without the slow tier
	$(BIN)/python -m pytest $(XDIST) -m "not slow" $(ARGS)

lint: install  ## ruff check and ruff format --check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install  ## ruff check --fix and ruff format
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

clean:  ## remove .venv and the caches
	rm -rf $(VENV) .pytest_cache .ruff_cache

help:  ## list these targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12
