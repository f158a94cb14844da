#!/usr/bin/env bash
# Builds the autoscalers Preheat is compared with, from their own Go modules, into $PREHEAT_CACHE/bin:
#   prometheus-adapter  sigs.k8s.io/prometheus-adapter/cmd/adapter (the HPA's custom/external metrics API)
#   keda-operator       github.com/kedacore/keda/v2/cmd/operator
#   keda-adapter        github.com/kedacore/keda/v2/cmd/adapter (KEDA's external metrics API server)
#   aibrix-controllers  github.com/vllm-project/aibrix/cmd/controllers (its PodAutoscaler controller)
# The HPA itself is kube-controller-manager's (cluster/build-binaries.sh).
# Versions are pinned in cluster/versions.env. Idempotent: a binary whose version stamp matches is not
# rebuilt. KEDA and AIBrix have replace directives in their go.mod, which Go ignores in a dependency,
# so each builds through a wrapper module that repeats them (as build-binaries.sh does for Kubernetes).
# Each build's wall time and binary size go to $PREHEAT_CACHE/bin/.peers-builds.jsonl. The CRDs the
# peers need (KEDA's config/crd/bases, AIBrix's PodAutoscaler) are copied from the same module versions
# to $PREHEAT_CACHE/peers/<peer>-<version>/crds, and their upstream RBAC (ServiceAccount, roles and
# bindings from config/) to .../rbac: lab/preheat_cluster/peers_*.py apply them as the upstream
# kustomizations would.
# `make peers` builds all; `make test` (scripts/test.sh) builds each after the cluster's binaries.
set -euo pipefail
LOG_TAG=build-peers
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# record NAME VERSION SECONDS: one JSON line per finished build (what it cost on this machine).
record() {
  local size
  size="$(stat -c %s "$bin/$1")"
  printf '{"binary": "%s", "version": "%s", "build_seconds": %s, "bytes": %s, "cores": %s, "finished_at": "%s"}\n' \
    "$1" "$2" "$3" "$size" "$(nproc)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$bin/.peers-builds.jsonl"
  log "$1 $2: ${3} s, $((size / 1048576)) MiB"
}

# wrapper_module DIR MODULE VERSION PKG...: a module that requires MODULE@VERSION with MODULE's own
# replace directives (read from its go.mod on the proxy) and imports PKG... so `go mod tidy` pins them.
wrapper_module() {
  local d="$1" mod="$2" ver="$3"; shift 3
  mkdir -p "$d"
  rm -f "$d/go.mod" "$d/go.sum" "$d/tools.go"  # a half-written module from an interrupted run
  local gomod
  gomod="$(cd "$d" && go mod download -json "$mod@$ver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "module preheat.local/peerbuild"
    echo
    grep -m1 -E '^go [0-9.]+' "$gomod"
    echo
    echo "require $mod $ver"
    echo
    # Single-line and block replaces alike: every "X [v] => Y v" line of the upstream go.mod.
    echo "replace ("
    { grep -E '=>' "$gomod" || true; } | sed -E 's/^replace[[:space:]]+//; s/^[[:space:]]+//' | sed 's/^/\t/'
    echo ")"
  } > "$d/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for p in "$@"; do echo "	_ \"$p\""; done
    echo ")"
  } > "$d/tools.go"
  (cd "$d" && GOFLAGS="$GOFLAGS -tags=tools -mod=mod" go mod tidy)
}

# copy_manifests NAME MODULE VERSION KIND FILE[:AS]...: manifests (paths inside the module) to the
# peers' cache, $PREHEAT_CACHE/peers/NAME-VERSION/KIND (crds, rbac), each under its own base name or AS.
copy_manifests() {
  local name="$1" mod="$2" ver="$3" kind="$4"; shift 4
  local dir f dest="$PREHEAT_CACHE/peers/$name-$ver/$kind"
  dir="$(go mod download -json "$mod@$ver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  mkdir -p "$dest"
  for f in "$@"; do
    case "$f" in
      *:*) install -m 0644 "$dir/${f%%:*}" "$dest/${f#*:}" ;;
      *) install -m 0644 "$dir/$f" "$dest/" ;;
    esac
  done
  log "$name $ver: $kind in $dest"
}

build_prometheus_adapter() {
  local v="$PROMETHEUS_ADAPTER_VERSION"
  stamp_ok prometheus-adapter "$v" && { log "prometheus-adapter $v cached"; return; }
  local d="$work/prometheus-adapter-$v" t0=$SECONDS
  # It has no replace directives, but `go install ...@v0.12.0` is refused here: go install looks up the
  # module's deprecation through its version list (@v/list), which the proxy answers 403. A wrapper
  # module asks for the exact version only.
  log "prometheus-adapter $v: wrapper module in $d"
  wrapper_module "$d" sigs.k8s.io/prometheus-adapter "$v" sigs.k8s.io/prometheus-adapter/cmd/adapter
  (cd "$d" && go build -ldflags "-s -w" -o "$bin/prometheus-adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter)
  stamp prometheus-adapter "$v"
  record prometheus-adapter "$v" $((SECONDS - t0))
}

build_keda() {
  local v="$KEDA_VERSION" ok=1
  copy_manifests keda github.com/kedacore/keda/v2 "$v" crds config/crd/bases/keda.sh_scaledobjects.yaml \
    config/crd/bases/keda.sh_scaledjobs.yaml config/crd/bases/keda.sh_triggerauthentications.yaml \
    config/crd/bases/keda.sh_clustertriggerauthentications.yaml \
    config/crd/bases/eventing.keda.sh_cloudeventsources.yaml \
    config/crd/bases/eventing.keda.sh_clustercloudeventsources.yaml
  # The operator's ServiceAccount and roles, and the metrics server's (auth delegation, the HPA
  # controller's read access to external.metrics.k8s.io).
  copy_manifests keda github.com/kedacore/keda/v2 "$v" rbac config/service_account/service_account.yaml \
    config/rbac/role.yaml config/rbac/role_binding.yaml \
    config/metrics-server/role.yaml:metrics_server_role.yaml \
    config/metrics-server/role_binding.yaml:metrics_server_role_binding.yaml
  for b in keda-operator keda-adapter; do stamp_ok "$b" "$v" || ok=0; done
  [ "$ok" = 1 ] && { log "keda $v cached"; return; }
  local d="$work/keda-$v" t0=$SECONDS
  log "keda $v: wrapper module in $d"
  wrapper_module "$d" github.com/kedacore/keda/v2 "$v" \
    github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter
  local ld="-s -w -X github.com/kedacore/keda/v2/version.Version=$v -X github.com/kedacore/keda/v2/version.GitCommit=module"
  log "keda $v: go build operator (the largest of the peers: every scaler's cloud SDK)"
  (cd "$d" && go build -ldflags "$ld" -o "$bin/keda-operator" github.com/kedacore/keda/v2/cmd/operator)
  stamp keda-operator "$v"
  record keda-operator "$v" $((SECONDS - t0))
  t0=$SECONDS
  log "keda $v: go build adapter"
  (cd "$d" && go build -ldflags "$ld" -o "$bin/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter)
  stamp keda-adapter "$v"
  record keda-adapter "$v" $((SECONDS - t0))
}

build_aibrix() {
  local v="$AIBRIX_VERSION"
  copy_manifests aibrix github.com/vllm-project/aibrix "$v" crds config/crd/autoscaling/autoscaling.aibrix.ai_podautoscalers.yaml
  copy_manifests aibrix github.com/vllm-project/aibrix "$v" rbac config/rbac/controller-manager/role.yaml \
    config/rbac/controller-manager/role_binding.yaml config/rbac/controller-manager/service_account_controller_manager.yaml
  stamp_ok aibrix-controllers "$v" && { log "aibrix $v cached"; return; }
  local d="$work/aibrix-$v" t0=$SECONDS
  log "aibrix $v: wrapper module in $d"
  wrapper_module "$d" github.com/vllm-project/aibrix "$v" github.com/vllm-project/aibrix/cmd/controllers
  # AIBrix v0.7.0 pins github.com/bytedance/sonic v1.14.2 (through gin), whose internal/rt has no map
  # layout for Go >= 1.26 ("undefined: GoMapIterator"); v1.15.0 has one (map_go126.go), so it is raised to that.
  if go version | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then
    (cd "$d" && go mod edit -require="github.com/bytedance/sonic@$AIBRIX_SONIC_VERSION" \
       && GOFLAGS="$GOFLAGS -tags=tools -mod=mod" go mod tidy)
  fi
  (cd "$d" && go build -ldflags "-s -w" -o "$bin/aibrix-controllers" github.com/vllm-project/aibrix/cmd/controllers)
  stamp aibrix-controllers "$v"
  record aibrix-controllers "$v" $((SECONDS - t0))
}

what="${1:-all}"
case "$what" in
  prometheus-adapter) build_prometheus_adapter ;;
  keda) build_keda ;;
  aibrix) build_aibrix ;;
  all) build_prometheus_adapter; build_aibrix; build_keda ;;
  *) echo "usage: $0 [all|prometheus-adapter|keda|aibrix]" >&2; exit 2 ;;
esac
log "done: $(ls "$bin" | tr '\n' ' ')"
