#!/usr/bin/env bash
# Everything CI runs: lint, unit tests, then the tests on the real local cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
# One pytest run, so the closing line counts every test; the session fixture brings the cluster up
# once for the tests marked 'cluster' and takes it down at the end.
set +e
"$PY" -m pytest tests "$@"
rc=$?
set -e
# Never leave cluster processes behind, even when a test failed half-way.
"$PY" -m preheat_cluster down >/dev/null 2>&1 || true
exit $rc
