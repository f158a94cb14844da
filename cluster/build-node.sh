#!/usr/bin/env bash
# Builds what a real node of the local cluster runs, into $PREHEAT_CACHE/bin: kubelet and kube-proxy
# (from the same k8s.io/kubernetes wrapper module as the control plane, so the Go build cache is
# shared), containerd v2 with its runc shim and ctr, crictl, and CoreDNS; and installs the Debian
# packages a node needs (runc, the CNI plugins, iptables, conntrack, podman/buildah, debootstrap).
# Idempotent like build-binaries.sh: a binary whose version stamp matches is not rebuilt, a package
# already installed is not reinstalled, so a second run takes seconds.
set -euo pipefail
LOG_TAG=build-node
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
timed() { local t0=$SECONDS; "$@"; log "$1 took $((SECONDS - t0)) s"; }

# Debian's packages where Debian's build is what we want: runc (containerd's default runtime), the
# reference CNI plugins (bridge, host-local, portmap, loopback), iptables for kube-proxy (IPVS is not
# in this kernel), conntrack (kube-proxy flushes stale UDP entries with it), podman/buildah to build
# images and debootstrap to make their base images (no container registry is reachable).
NODE_PACKAGES=(runc containernetworking-plugins iptables conntrack podman buildah debootstrap ca-certificates)
install_packages() {
  local missing=()
  for p in "${NODE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" = 0 ] && { log "debian packages installed"; return; }
  command -v apt-get >/dev/null || { log "missing packages ${missing[*]} and no apt-get: install them"; exit 1; }
  log "apt-get install ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# containerd without CGO: the btrfs snapshotter (the only cgo part) drops out by its build constraint;
# zfs and devmapper are not used here. The shim is built without gRPC, like upstream's.
build_containerd() {
  local ok=1
  for b in containerd containerd-shim-runc-v2 ctr; do stamp_ok "$b" "$CONTAINERD_VERSION" || ok=0; done
  [ "$ok" = 1 ] && { log "containerd $CONTAINERD_VERSION cached"; return; }
  local m=github.com/containerd/containerd/v2
  local ld="-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Revision=module"
  local tags="urfave_cli_no_docs no_btrfs no_zfs no_devmapper"
  GOBIN="$bin" go install -tags "$tags" -ldflags "$ld" "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/ctr@$CONTAINERD_VERSION"
  GOBIN="$bin" go install -tags "$tags no_grpc" -ldflags "$ld" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  for b in containerd containerd-shim-runc-v2 ctr; do stamp "$b" "$CONTAINERD_VERSION"; done
}

build_crictl() {
  stamp_ok crictl "$CRI_TOOLS_VERSION" && { log "crictl $CRI_TOOLS_VERSION cached"; return; }
  local ld="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRI_TOOLS_VERSION#v}"
  GOBIN="$bin" go install -ldflags "$ld" "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION"
  stamp crictl "$CRI_TOOLS_VERSION"
}

build_coredns() {
  stamp_ok coredns "$COREDNS_VERSION" && { log "coredns $COREDNS_VERSION cached"; return; }
  GOBIN="$bin" go install -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=module" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
  stamp coredns "$COREDNS_VERSION"
}

# kubelet and kube-proxy come from the control plane's wrapper module (build-binaries.sh writes it):
# the same module graph, so every package the two share with kube-apiserver is already compiled.
build_node_kubernetes() {
  local want="$KUBERNETES_VERSION"
  stamp_ok kubelet "$want" && stamp_ok kube-proxy "$want" && { log "kubelet, kube-proxy $want cached"; return; }
  local d="$work/kubernetes-$want"
  [ -f "$d/go.mod" ] || bash "$here/build-binaries.sh" kubernetes
  # Under the same `tools` tag as build-binaries.sh's tools.go, so its `go mod tidy` keeps these too.
  cat > "$d/tools_node.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$d" && GOFLAGS="$GOFLAGS -tags=tools -mod=mod" go mod tidy)
  local minor="${want#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$want -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  log "kubelet, kube-proxy $want: go build (long on 2 cores)"
  (cd "$d" && go build -ldflags "$ld" -o "$bin/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  stamp kubelet "$want"; stamp kube-proxy "$want"
}

# The pause container: Kubernetes' own pause.c from the module cache, linked statically.
build_pause() {
  stamp_ok pause "$KUBERNETES_VERSION" && { log "pause $KUBERNETES_VERSION cached"; return; }
  local src
  src="$(cd /tmp && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/build/pause/linux/pause.c"
  command -v gcc >/dev/null || { log "gcc is needed to build the pause container"; exit 1; }
  gcc -Os -Wall -Werror -static -DVERSION="$KUBERNETES_VERSION-preheat" -o "$bin/pause" "$src"
  strip "$bin/pause"
  stamp pause "$KUBERNETES_VERSION"
}

what="${1:-all}"
case "$what" in
  packages) timed install_packages ;;
  containerd) timed build_containerd ;;
  crictl) timed build_crictl ;;
  coredns) timed build_coredns ;;
  kubernetes) timed build_node_kubernetes ;;
  pause) timed build_pause ;;
  all) timed install_packages; timed build_pause; timed build_containerd; timed build_crictl
       timed build_coredns; timed build_node_kubernetes ;;
  *) echo "usage: $0 [all|packages|containerd|crictl|coredns|kubernetes|pause]" >&2; exit 2 ;;
esac
log "done"
