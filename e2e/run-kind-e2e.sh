#!/usr/bin/env bash
# Preheat end to end on kind (needs Docker): create the cluster, build and load both images, install
# Prometheus and the Helm chart, apply a sample endpoint, replay a trace through it, then run the same
# pytest suite that runs against the local cluster, pointed at this cluster.
#
#   e2e/run-kind-e2e.sh            # everything; deletes the cluster at the end
#   KEEP_CLUSTER=1 e2e/run-kind-e2e.sh   # leave the cluster up for a look around
#
# Environment: KIND (kind binary), HELM, KUBECTL, PYTHON (a venv with `pip install -e .[operator,dev] -e ./lab`),
# TRACE (trace file for the replay; default the committed Azure code-trace excerpt), COMPRESS (10),
# REPLAY_SECONDS (wall-clock cap on the replay, 90).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

KIND="${KIND:-kind}"
HELM="${HELM:-helm}"
KUBECTL="${KUBECTL:-kubectl}"
PYTHON="${PYTHON:-$repo/.venv/bin/python}"
CLUSTER="${CLUSTER:-preheat-e2e}"
TAG="${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' manifests/chart/preheat/Chart.yaml)}"
RELEASE="${RELEASE:-preheat}"
RELEASE_NS="${RELEASE_NS:-preheat-system}"
SAMPLE_NS="${SAMPLE_NS:-preheat-e2e}"
SAMPLE="${SAMPLE:-crds/samples/tiny-cpu.yaml}"
REPLAY_SECONDS="${REPLAY_SECONDS:-90}"
COMPRESS="${COMPRESS:-10}"
TRACE="${TRACE:-tests/closedloop/data/azure_code_2023_excerpt.csv}"
PROM_URL="http://127.0.0.1:30090"
work="$(mktemp -d)"
export KUBECONFIG="$work/kubeconfig"
pf_pid=""

log() { printf '\n[kind-e2e] %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "kind-e2e: '$1' not found: $2" >&2; exit 2; }; }

cleanup() {
  local rc=$?
  if [ -n "$pf_pid" ]; then kill "$pf_pid" 2>/dev/null || true; fi
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    log "cluster kept: export KUBECONFIG=$KUBECONFIG  (delete with: $KIND delete cluster --name $CLUSTER)"
  else
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT

need docker "install Docker (the kind nodes are containers)"
need "$KIND" "see https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need "$HELM" "see https://helm.sh/docs/intro/install/ (or make binaries: ~/.cache/preheat/bin/helm)"
need "$KUBECTL" "see https://kubernetes.io/docs/tasks/tools/"
[ -x "$PYTHON" ] || { echo "kind-e2e: no Python at $PYTHON: run make setup first" >&2; exit 2; }

log "1/8 kind cluster $CLUSTER"
if ! "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  "$KIND" create cluster --name "$CLUSTER" --config e2e/kind-config.yaml --wait 120s
fi
"$KIND" get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"

log "2/8 images preheat/operator:$TAG and preheat/model-server:$TAG"
docker build -f operator/Dockerfile -t "preheat/operator:$TAG" .
docker build -f model-server/Dockerfile -t "preheat/model-server:$TAG" .
"$KIND" load docker-image --name "$CLUSTER" "preheat/operator:$TAG" "preheat/model-server:$TAG"

log "3/8 Prometheus (annotation-based discovery, Preheat's alert rules loaded)"
"$KUBECTL" apply -f e2e/prometheus.yaml
"$KUBECTL" -n monitoring create configmap preheat-rules \
  --from-file=preheat-rules.yaml=manifests/alerts/preheat-rules.yaml --dry-run=client -o yaml \
  | "$KUBECTL" apply -f -
"$KUBECTL" -n monitoring rollout status deploy/prometheus-server --timeout=180s

log "4/8 helm install $RELEASE (lint first)"
"$HELM" lint manifests/chart/preheat
"$HELM" upgrade --install "$RELEASE" manifests/chart/preheat \
  --namespace "$RELEASE_NS" --create-namespace \
  --set prometheus.url=http://prometheus-server.monitoring.svc:9090 \
  --set operator.image.pullPolicy=Never \
  --wait --timeout 5m

log "5/8 sample endpoint $SAMPLE in $SAMPLE_NS"
"$KUBECTL" create namespace "$SAMPLE_NS" --dry-run=client -o yaml | "$KUBECTL" apply -f -
"$KUBECTL" -n "$SAMPLE_NS" apply -f "$SAMPLE"
endpoint="$("$KUBECTL" -n "$SAMPLE_NS" get -f "$SAMPLE" -o jsonpath='{.metadata.name}')"
"$KUBECTL" -n "$SAMPLE_NS" wait "inferenceendpoint/$endpoint" --for=condition=Ready --timeout=600s

log "6/8 replay $TRACE (${COMPRESS}x, at most ${REPLAY_SECONDS}s) through a port-forward to service/$endpoint"
# The load generator only sends to loopback addresses: the port-forward gives it one.
"$KUBECTL" -n "$SAMPLE_NS" port-forward "service/$endpoint" 18000:8000 >"$work/port-forward.log" 2>&1 &
pf_pid=$!
for _ in $(seq 1 30); do
  curl -fsS http://127.0.0.1:18000/health/ready >/dev/null 2>&1 && break
  sleep 1
done
"$PYTHON" -m preheat_lab.loadgen --trace "$TRACE" --compress "$COMPRESS" --address 127.0.0.1:18000 \
  --model "$endpoint" --max-duration-s "$REPLAY_SECONDS" --max-requests 2000 --out "$work/replay.json"
kill "$pf_pid" 2>/dev/null || true; pf_pid=""
"$KUBECTL" -n "$SAMPLE_NS" get inferenceendpoint "$endpoint" -o wide

log "7/8 helm uninstall $RELEASE (the pytest suite installs its own release)"
"$KUBECTL" -n "$SAMPLE_NS" delete -f "$SAMPLE" --wait=true --timeout=120s
"$HELM" uninstall "$RELEASE" --namespace "$RELEASE_NS" --wait --timeout 2m

log "8/8 pytest suite against kind"
# The fixture uses an existing cluster when PREHEAT_KUBECONFIG is set; pod traffic goes through the
# API server's pod proxy because kind's pod IPs are not reachable from the host.
export PREHEAT_KUBECONFIG="$KUBECONFIG"
export PREHEAT_PROMETHEUS_URL="$PROM_URL"
export PREHEAT_POD_NETWORK=proxy
export PREHEAT_IMAGE_TAG="$TAG"
"$PYTHON" -m pytest -m cluster tests -x -q
log "done"
