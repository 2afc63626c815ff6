# Two commands for a newcomer: `make demo` and `make test`. Both create the environment from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test lint types unit calibrate clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "specroute needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/specroute demo

lint: install
	$(BIN)/ruff check specroute tests
	$(BIN)/ruff format --check specroute tests

types: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest

test: lint types unit

calibrate: install
	$(BIN)/specroute emulate-calibration

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist *.egg-info
