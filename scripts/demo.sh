#!/usr/bin/env bash
# `make demo`: the local cluster + Prometheus + the Preheat operator, a tiny-model endpoint, and a
# real trace (ServeGen m-small's morning ramp, compressed 240x) replayed against it once per mode —
# preheat mode, Preheat's own reactive-only mode, then the real Kubernetes HPA (kube-controller-manager's,
# on the request rate through prometheus-adapter) scaling the same endpoint — with live progress, a PNG
# plot and a summary line per mode. Every replica of every mode downloads the model first from a model
# store on a tc-shaped link (preheat_lab.closedloop.modelstore: 2.7 MB at 0.98 Mbit/s, 22 s alone, the
# download time of a 16 GB model at 5.8 Gbit/s), so cold starts are tens of seconds for the reason they
# are in production. Takes the cluster down at the end, also on failure or Ctrl-C.
# `make setup binaries node-binaries images peers-hpa` ran before (the last builds prometheus-adapter).
#
# Environment knobs: DEMO_MODES (default "preheat,reactive,hpa"; any subset), DEMO_TRACE, DEMO_OUT (default out/demo, git-ignored),
# DEMO_STATE_DIR (the cluster's state dir, default .cluster), DEMO_KEEP_CLUSTER=1 to leave the cluster
# up afterwards. A cluster that was already up before the demo is left up.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT="${DEMO_OUT:-out/demo}"
MODES="${DEMO_MODES:-preheat,reactive,hpa}"
# .cluster/, or a dir under /tmp where the checkout is too deep for the nodes' unix sockets.
STATE="${DEMO_STATE_DIR:-$("$PY" -c "from preheat_cluster.launcher import default_state_dir; print(default_state_dir())")}"
TRACE="${DEMO_TRACE:-../shared/traces/servegen_m-small_10min.csv}"
# A fresh clone may have the traces beside it or not: fall back to the committed excerpt (day 1 and
# day 2's morning of m-small, what the closed-loop test replays) so the demo still runs the same slice
# with a day of the endpoint's past before it (the forecast has yesterday to lead with).
START_S=$((86400 + 12600))
if [ ! -f "$TRACE" ]; then
  echo "demo: $TRACE not found; using the committed ServeGen excerpt (day 1 + day 2's morning)"
  TRACE=tests/closedloop/data/servegen_m-small_days1-2.csv
fi
mkdir -p "$OUT"

started_cluster=0
cleanup() {
  rc=$?
  if [ "$started_cluster" = 1 ] && [ "${DEMO_KEEP_CLUSTER:-0}" != 1 ]; then
    echo "demo: taking the local cluster down"
    "$PY" -m preheat_cluster --state-dir "$STATE" down || true
  fi
  exit $rc
}
trap cleanup EXIT INT TERM

# The tiny model is generated once into the cache; doing it here keeps the first pod's cold start
# about loading, not about training a tokenizer.
"$PY" -c "from preheat_server.models import load_model; load_model('tiny', device='cpu')" >/dev/null

if "$PY" -c "import sys; from preheat_cluster import LocalCluster; sys.exit(0 if LocalCluster(state_dir='$STATE').is_up() else 1)"; then
  echo "demo: using the local cluster that is already up in $STATE (it stays up)"
else
  echo "demo: bringing up the local cluster (API server, controllers, two real nodes, Prometheus)"
  started_cluster=1
  "$PY" -m preheat_cluster --state-dir "$STATE" up
fi

echo "demo: replaying $TRACE (modes: $MODES)"
"$PY" -m preheat_lab.closedloop --cluster-state "$STATE" --trace "$TRACE" --start-s "$START_S" --modes "$MODES" \
  --out "$OUT/closedloop.json" --plot "$OUT/closedloop.png" --work-dir "$OUT/logs" | tee "$OUT/demo.log"

echo
echo "demo: plot  $OUT/closedloop.png"
# one line per mode (the run prints them as one SUMMARY line, " | " between modes)
grep '^SUMMARY ' "$OUT/demo.log" | tail -1 | sed 's/^SUMMARY //; s/ | /\n/g' | sed 's/^/SUMMARY /'
