# Preheat: everything a developer or CI runs goes through here.
SHELL := /bin/bash
export PREHEAT_CACHE ?= $(HOME)/.cache/preheat
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.preheat-setup-stamp

.PHONY: setup binaries test test-unit test-cluster lint cluster-up cluster-down demo \
        bench-server bench-sim bench-forecast clean

# The venv is rebuilt only when pyproject.toml changes; pip's cache lives outside the repo.
$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	@touch $(STAMP)

setup: $(STAMP)

binaries:
	bash cluster/build-binaries.sh all

lint: setup
	$(VENV)/bin/ruff check .

# scripts/test.sh builds the binaries and the venv side by side (a fresh machine spends most of its
# time there), then runs ruff and one pytest session.
test:
	bash scripts/test.sh

test-unit: setup
	$(PY) -m pytest -m "not cluster" tests

test-cluster: setup binaries
	$(PY) -m pytest -m cluster tests

cluster-up: setup binaries
	$(PY) -m preheat_cluster up

cluster-down:
	@if [ -x $(PY) ]; then $(PY) -m preheat_cluster down; else echo "no venv: nothing started"; fi

demo: setup binaries
	bash scripts/demo.sh

bench-server: setup
	$(PY) model-server/bench/bench_server.py --out bench-results/server.json

bench-sim: setup
	$(PY) -m preheat.sim.bench --out bench-results/simulate.json

bench-forecast: setup
	$(PY) -m preheat.forecast.bench --out bench-results/forecast.json

clean: cluster-down
	rm -rf $(VENV) .cluster
