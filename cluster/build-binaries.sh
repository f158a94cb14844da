#!/usr/bin/env bash
# Builds the local cluster's binaries from Go modules into $PREHEAT_CACHE/bin.
# Idempotent: a binary whose version stamp matches is not rebuilt, so a second run takes seconds.
set -euo pipefail
LOG_TAG=build-binaries
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build_kubernetes() {
  local want="$KUBERNETES_VERSION" all_ok=1
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    stamp_ok "$b" "$want" || all_ok=0
  done
  [ "$all_ok" = 1 ] && { log "kubernetes $want cached"; return; }
  local d="$work/kubernetes-$want"
  mkdir -p "$d"
  log "kubernetes $want: preparing wrapper module in $d"
  # The replace list comes from the tag's own go.mod: every './staging/src/k8s.io/X' there is
  # published as k8s.io/X at the staging version, so we pin each one to it.
  local gomod
  gomod="$(cd "$d" && go mod download -json "k8s.io/kubernetes@$want" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "module preheat.local/kubebuild"
    echo
    echo "go 1.25"
    echo
    echo "require k8s.io/kubernetes $want"
    echo
    echo "replace ("
    grep -oE 'k8s\.io/[A-Za-z0-9._/-]+ => \./staging/src/k8s\.io/[A-Za-z0-9._/-]+' "$gomod" \
      | awk -v v="$KUBERNETES_STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "$d/go.mod"
  cat > "$d/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$d" && go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$d" && GOFLAGS="$GOFLAGS -tags=tools -mod=mod" go mod tidy)
  local minor="${want#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$want -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  log "kubernetes $want: go build (long on 2 cores)"
  (cd "$d" && go build -ldflags "$ld" -o "$bin/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do stamp "$b" "$want"; done
}

build_etcd() {
  stamp_ok etcd "$ETCD_VERSION" && { log "etcd $ETCD_VERSION cached"; return; }
  local d="$work/etcd-$ETCD_VERSION"
  mkdir -p "$d"
  cat > "$d/main.go" <<'GO'
// Wrapper main: the etcd server binary is etcdmain.Main, the same entry point upstream's uses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  printf 'module preheat.local/etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$d/go.mod"
  (cd "$d" && GOFLAGS="$GOFLAGS -mod=mod" go mod tidy && go build -ldflags "-s -w" -o "$bin/etcd" .)
  stamp etcd "$ETCD_VERSION"
}

build_helm() {
  stamp_ok helm "$HELM_VERSION" && { log "helm $HELM_VERSION cached"; return; }
  local major="${HELM_VERSION%%.*}"
  local ld="-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION"
  GOBIN="$bin" go install -ldflags "$ld" "helm.sh/helm/$major/cmd/helm@$HELM_VERSION"
  stamp helm "$HELM_VERSION"
}

# Debian's prometheus package is built without Kubernetes service discovery, so the cluster builds its
# own from the Go module, keeping only the Kubernetes SD plugin (upstream's remove_all_sd build tags).
build_prometheus() {
  local ok=1
  for b in prometheus promtool; do stamp_ok "$b" "$PROMETHEUS_MODULE_VERSION" || ok=0; done
  [ "$ok" = 1 ] && { log "prometheus $PROMETHEUS_MODULE_VERSION cached"; return; }
  local ld="-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_MODULE_VERSION"
  ld="$ld -X github.com/prometheus/common/version.Branch=module -X github.com/prometheus/common/version.Revision=module"
  GOBIN="$bin" go install -tags "remove_all_sd,enable_kubernetes_sd" -ldflags "$ld" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION"
  for b in prometheus promtool; do stamp "$b" "$PROMETHEUS_MODULE_VERSION"; done
}

what="${1:-all}"
case "$what" in
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  prometheus) build_prometheus ;;
  all) build_etcd; build_prometheus; build_helm; build_kubernetes ;;
  *) echo "usage: $0 [all|kubernetes|etcd|helm|prometheus]" >&2; exit 2 ;;
esac
log "done: $(ls "$bin" | tr '\n' ' ')"
