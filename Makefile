# Two commands for a newcomer: `make demo` and `make test`. Both create the environment from nothing.
# `make demo` installs only what the demo runs (the proxy, the bench, its plots); `make test` adds
# the test tools (no torch: the GPU benchmark's CPU-path test skips without `.[gpu-bench]`).
PYTHON ?= python3
VENV   ?= .venv
PORT   ?= 8000
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
VENV_STAMP := $(VENV)/.venv-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
TEST_STAMP := $(VENV)/.test-stamp

.PHONY: install demo test lint types unit calibrate clean

# pip's own progress shows (no --quiet: a first install takes a while); the last line says how
# long the install took and how big the environment is.
define pip_install
@start=$$(date +%s); \
$(PY) -m pip install -e '.[$(1)]' && \
echo "make: installed .[$(1)] in $$(( $$(date +%s) - start )) s; $(VENV) is $$(du -sh $(VENV) | cut -f1)"
endef

$(VENV_STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "specroute needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	@touch $@

$(DEMO_STAMP): pyproject.toml $(VENV_STAMP)
	$(call pip_install,demo)
	@touch $@

$(TEST_STAMP): pyproject.toml $(VENV_STAMP)
	$(call pip_install,dev)
	@touch $@ $(DEMO_STAMP)

install: $(TEST_STAMP)

# `make demo PORT=8080` serves somewhere else.
demo: $(DEMO_STAMP)
	$(BIN)/specroute demo --port $(PORT)

lint: install
	$(BIN)/ruff check specroute tests benchmarks
	$(BIN)/ruff format --check specroute tests benchmarks

types: install
	$(BIN)/mypy

# Two workers by default (`make test TEST_WORKERS=1` runs them one by one): most of a test's time
# is spent waiting on the servers it starts, so two cores run them in about half the time. A test
# file's tests stay on one worker (`loadfile`): its module-scoped servers start once.
TEST_WORKERS ?= 2
unit: install
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test: lint types unit

calibrate: $(DEMO_STAMP)
	$(BIN)/specroute calibrate

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build dist *.egg-info

# SGLang's own argument resolver on the launcher's command lines (NEXTN, EAGLE, EAGLE3; several
# depths and TP sizes). A separate environment: sglang goes in without its GPU dependencies, torch
# and torchvision are the builds pip finds on this machine's disk. No GPU, no model download.
SGLANG_VENV  ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed-stamp

$(SGLANG_STAMP): deploy/sglang-check/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install --quiet --upgrade pip
	$(SGLANG_VENV)/bin/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(SGLANG_VENV)/bin/pip install --quiet --no-deps sglang==0.5.23
	$(SGLANG_VENV)/bin/pip install --quiet -r deploy/sglang-check/requirements.txt
	$(SGLANG_VENV)/bin/pip install --quiet -e . pytest
	@touch $(SGLANG_STAMP)

.PHONY: sglang-check
sglang-check: $(SGLANG_STAMP)
	$(SGLANG_VENV)/bin/python -m specroute.launch.sglang_matrix
	$(SGLANG_VENV)/bin/python -m pytest -q -rs tests/test_sglang_routes.py -k sglangs_own_app

# vLLM's own `vllm serve` argument parser on every vLLM command line `launch` and `tune` make
# (MTP, EAGLE, EAGLE3; several depths, TP sizes, per-depth limits and flags), plus lines it must
# refuse. A separate environment: vllm goes in without its GPU kernels (deploy/vllm-check/); torch
# 2.14.0 (vllm's pin) with the CUDA libraries it needs to import, about 7 GB. No GPU, no model.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): deploy/vllm-check/requirements.txt deploy/vllm-check/requirements-nodeps.txt pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet torch==2.14.0
	$(VLLM_VENV)/bin/pip install --quiet --no-deps vllm==0.33.0
	$(VLLM_VENV)/bin/pip install --quiet -r deploy/vllm-check/requirements.txt
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -r deploy/vllm-check/requirements-nodeps.txt
	$(VLLM_VENV)/bin/pip install --quiet -e .
	@touch $(VLLM_STAMP)

.PHONY: vllm-check
vllm-check: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m specroute.tune.vllm_matrix

# vLLM's own benchmark client (`vllm bench serve`) through the proxy in front of emulated vLLM
# servers: its accept length against specroute bench's and the servers' counters (within 5%).
.PHONY: vllm-bench-serve
vllm-bench-serve: $(VENV_STAMP) $(VLLM_STAMP)
	$(PY) benchmarks/vllm_bench_serve.py --vllm-venv $(VLLM_VENV)

# The dashboard's browser test drives Debian's chromium (never a downloaded browser). CI runs as
# root on a fresh machine, so `make test` installs it there; elsewhere without root the test skips.
.PHONY: browser dashboard-screenshot
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else \
	    echo "no /usr/bin/chromium and not root: tests/test_dashboard_browser.py will skip"; \
	  fi; \
	fi

unit: browser

# Refresh the README's picture of the dashboard from the browser test.
dashboard-screenshot: install browser
	SPECROUTE_DASHBOARD_SCREENSHOT=docs/img/dashboard.png $(BIN)/pytest -q tests/test_dashboard_browser.py

# Resilience figures (loopback only; each stops by itself). `make chaos`: the bench through the
# proxy while backends are killed, frozen, restarted, answer 500s or malformed SSE (seeded).
# `make soak`: steady streams for a set time, memory, descriptors, loop lag and latency sampled.
CHAOS_DURATION    ?= 180
CHAOS_CONCURRENCY ?= 32
CHAOS_SEED        ?= 7
SOAK_DURATION     ?= 600
SOAK_CONCURRENCY  ?= 256

.PHONY: chaos soak
chaos: install
	$(PY) benchmarks/chaos.py --duration $(CHAOS_DURATION) --concurrency $(CHAOS_CONCURRENCY) --seed $(CHAOS_SEED)

soak: install
	$(PY) benchmarks/soak.py --duration $(SOAK_DURATION) --concurrency $(SOAK_CONCURRENCY)
