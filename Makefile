# Preheat: everything a developer or CI runs goes through here.
SHELL := /bin/bash
export PREHEAT_CACHE ?= $(HOME)/.cache/preheat
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.preheat-setup-stamp

.PHONY: setup binaries peers peers-hpa node-binaries images shell crd test test-unit test-cluster test-lmeval lint cluster-up cluster-down demo \
        bench-server bench-engine bench-http bench-peers bench-sim bench-frontier bench-fine-grid bench-heldout bench-heldout-seeds bench-idle-nights bench-busy-serverless bench-chat bench-seeds bench-forecast bench-cluster clean

# The venv is rebuilt only when a pyproject (the product's or the lab's) changes; pip's cache lives
# outside the repo.
$(STAMP): pyproject.toml lab/pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	@touch $(STAMP)

setup: $(STAMP)

binaries:
	bash cluster/build-binaries.sh all

# The real autoscalers Preheat is compared with (prometheus-adapter for the HPA, KEDA, AIBrix), from their
# Go modules; `make test` builds them too (scripts/test.sh). Build times and sizes: $(PREHEAT_CACHE)/bin/.peers-builds.jsonl.
peers:
	nice -n 15 bash cluster/build-peers.sh all

peers-hpa:
	bash cluster/build-peers.sh prometheus-adapter

# A real node's binaries (kubelet, kube-proxy, containerd, crictl, CoreDNS, pause) and Debian packages.
node-binaries: binaries
	bash cluster/build-node.sh all

# The images real nodes run: a debootstrapped Debian base, pause, and the operator and CPU
# model-server images from their Dockerfiles (cached by content; cluster/images.sh says how).
images:
	bash cluster/images.sh all

# The local cluster on two real nodes (kubelet + containerd) in its own network namespace.
lint: setup
	$(VENV)/bin/ruff check .

# scripts/test.sh builds the binaries and the venv side by side (a fresh machine spends most of its
# time there), then runs ruff and one pytest session.
test:
	bash scripts/test.sh

test-unit: setup
	$(PY) -m pytest -m "not cluster" tests

# lm-eval's extra is not in `make setup` (pyproject.toml says why): installed here, on demand.
test-lmeval: setup
	$(PY) -m pip install -q -e ".[lmeval]"
	$(PY) -m pytest tests/server/test_lm_eval.py

test-cluster: setup binaries node-binaries images
	bash scripts/netns.sh --rm preheat-test-cluster $(PY) -m pytest -m cluster tests

# The local cluster lives in the network namespace `preheat-dev` (scripts/netns.sh says why);
# `make shell` opens a shell there with KUBECONFIG set, for kubectl and friends.
cluster-up: setup binaries node-binaries images
	bash scripts/netns.sh preheat-dev $(PY) -m preheat_cluster up

cluster-down:
	@if [ -x $(PY) ]; then bash scripts/netns.sh preheat-dev $(PY) -m preheat_cluster down; else echo "no venv: nothing started"; fi
	-@ip netns del preheat-dev 2>/dev/null || true

# The cluster's state dir is the launcher's default (.cluster/, or a short /tmp dir for a deep checkout).
shell: setup
	KUBECONFIG=$$($(PY) -c 'from preheat_cluster.launcher import default_state_dir; print(default_state_dir())')/kubeconfig PATH=$(PREHEAT_CACHE)/bin:$(CURDIR)/$(VENV)/bin:$$PATH bash scripts/netns.sh preheat-dev bash

# The demo's hpa mode runs the real HPA on prometheus-adapter (only that peer: seconds when cached).
demo: setup binaries node-binaries images peers-hpa
	bash scripts/netns.sh --rm preheat-demo bash scripts/demo.sh

# The model server's benchmark: the engine in-process (bench-engine) and the HTTP server (bench-http).
bench-server: bench-engine bench-http

bench-engine: setup
	$(PY) model-server/bench/bench_engine.py --out bench-results/engine.json

bench-http: setup
	$(PY) model-server/bench/bench_http.py --out bench-results/http.json

# Issue 19: preheat-server beside the llama.cpp server (xllamacpp), CTranslate2 and transformers on the same
# SmolLM2-135M weights, the machine's bandwidth/FLOP roofline, MiniLM vs sentence-transformers (~20-25 min on
# 2 cores; README "Side by side"). The peers are lab tools, installed here on demand, not by `make setup`.
PEERS_PIP := xllamacpp==2026.10.11549 ctranslate2==4.8.5 sentence-transformers
PEERS_ARGS ?=
bench-peers: setup
	@$(PY) -c "import xllamacpp, ctranslate2, sentence_transformers" 2>/dev/null || $(PY) -m pip install -q $(PEERS_PIP)
	@command -v mbw >/dev/null || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  export DEBIAN_FRONTEND=noninteractive; { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq mbw >/dev/null; } || echo "mbw not installed: torch's read/copy figures only"; }
	$(PY) model-server/bench/bench_peers.py --out bench-results/peers.json $(PEERS_ARGS)

bench-sim: setup
	$(PY) -m preheat_lab.bench_sim --out bench-results/simulate.json

# The cost-SLO frontier (README table, bench-results/frontier*): long, nice it on a shared machine.
bench-frontier: setup
	$(PY) -m preheat_lab.bench_frontier --out-dir bench-results

# The frontier table's verdicts with U's midpoints added (0.35 ... 0.95), measured instead of interpolated:
# bench-results/frontier-fine*. Needs the stored frontier (bench-frontier) of this checkout's code.
bench-fine-grid: setup
	$(PY) -m preheat_lab.bench_fine_grid --out-dir bench-results

# The frontier on variants the policy was not tuned on (fleet sizes, idle spans): bench-results/heldout*.
bench-heldout: setup
	$(PY) -m preheat_lab.bench_heldout --out bench-results/heldout.json

# The held-out verdicts on other draws of the arrivals (seeds 1, 2, one process each; seed 0 is bench-heldout).
bench-heldout-seeds: setup
	$(PY) -m preheat_lab.bench_heldout --seed 1 --out bench-results/heldout-seed1.json & p1=$$!; \
	$(PY) -m preheat_lab.bench_heldout --seed 2 --out bench-results/heldout-seed2.json & p2=$$!; \
	wait $$p1 && wait $$p2
	$(PY) -m preheat_lab.bench_heldout --compare-seeds 0=bench-results/heldout.json \
		1=bench-results/heldout-seed1.json 2=bench-results/heldout-seed2.json --out bench-results/heldout_seeds.md

# A synthetic serverless endpoint with idle nights (preheat_lab.idle_nights), every policy at its defaults and
# Preheat with scaleToZero: bench-results/frontier-idle-nights-measured*.
IDLE_NIGHTS := $(PREHEAT_CACHE)/idle-nights.csv
bench-idle-nights: setup
	@mkdir -p $(PREHEAT_CACHE)
	$(PY) -m preheat_lab.idle_nights $(IDLE_NIGHTS)
	$(VENV)/bin/preheat frontier --trace $(IDLE_NIGHTS) --cold-start ../shared/traces/alibaba_cold_starts_ms.csv --jobs 2 \
		--json bench-results/frontier-idle-nights-measured.json --plot bench-results/frontier-idle-nights-measured.png
	$(VENV)/bin/preheat frontier --trace $(IDLE_NIGHTS) --cold-start ../shared/traces/alibaba_cold_starts_ms.csv \
		--policy preheat --preheat min_replicas=0 --preheat scale_to_zero=true \
		--json bench-results/frontier-idle-nights-measured-stz.json

# The same endpoint never idle (--level 1.5: 0.3-2.7 requests/s, +-30 % over the week, a fleet of one to
# four), every policy at its defaults: bench-results/frontier-busy-serverless-measured*.
BUSY_SERVERLESS := $(PREHEAT_CACHE)/busy-serverless.csv
bench-busy-serverless: setup
	@mkdir -p $(PREHEAT_CACHE)
	$(PY) -m preheat_lab.idle_nights $(BUSY_SERVERLESS) --level 1.5
	$(VENV)/bin/preheat frontier --trace $(BUSY_SERVERLESS) --cold-start ../shared/traces/alibaba_cold_starts_ms.csv --jobs 2 \
		--json bench-results/frontier-busy-serverless-measured.json --plot bench-results/frontier-busy-serverless-measured.png

# Synthetic one-hour chat traffic (preheat_lab.chat_traffic: mild, medium, bursty; seeds 1, 2) x cold start
# {30 s, measured, 300 s}, every policy at its defaults: bench-results/frontier-chat.{md,json}, chat/*.json.
bench-chat: setup
	$(PY) -m preheat_lab.bench_chat --out-dir bench-results --jobs 2

# The frontier's verdict on other draws of the arrivals (seeds 1, 2; seed 0 from bench-frontier's JSON).
bench-seeds: setup
	$(PY) -m preheat_lab.bench_seeds --out bench-results/frontier_seeds.json --jobs 2

bench-forecast: setup
	$(PY) -m preheat_lab.bench_forecast --out bench-results/forecast.json

# The CRD is generated from the pydantic spec; the chart carries a copy (a test keeps them equal).
crd: setup
	$(PY) -m preheat crd > crds/inferenceendpoint.yaml
	cp crds/inferenceendpoint.yaml manifests/chart/preheat/crds/inferenceendpoint.yaml
	$(PY) scripts/crd_reference.py --write README.md

bench-cluster: setup binaries node-binaries images
	bash scripts/netns.sh --rm preheat-bench $(PY) -m preheat_lab.bench_cluster --out bench-results/cluster.json

clean: cluster-down
	rm -rf $(VENV) .cluster
