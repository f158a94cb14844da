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
"$VENV/bin/python" -m pip install -q -e ".[operator,server,plot,dev]"
