#!/usr/bin/env bash
# `make images`: builds the images the local cluster's nodes run, with podman, from the project's own
# Dockerfiles, and saves each as an archive the nodes' containerd imports:
#   - a Debian bookworm base with Python, made by debootstrap (no container registry is reachable
#     here, so no public base image can be pulled; the Dockerfiles still default to python:*-slim),
#   - the pause image, Kubernetes' pause.c built by cluster/build-node.sh,
#   - preheat/operator from operator/Dockerfile and preheat/model-server from model-server/Dockerfile.
# Everything is cached by content: the base by its package list, an image by the hash of its
# Dockerfile, build arguments, base image and every file the Dockerfile COPYs; a second run takes
# seconds. Usage: cluster/images.sh [all|base|pause|operator|lightweight-server|model-server|model-server-cuda]...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
PREHEAT_CACHE="${PREHEAT_CACHE:-$HOME/.cache/preheat}"
out="$PREHEAT_CACHE/images"
mkdir -p "$out"
log() { echo "[images] $*" >&2; }
timed() { local t0=$SECONDS; "$@"; log "$* took $((SECONDS - t0)) s"; }

BASE_SUITE=bookworm
# python-is-python3: the Dockerfiles call `python`, as on the python:*-slim images.
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates
BASE_MIRROR="${PREHEAT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
APP_VERSION="$(sed -nE 's/^appVersion: *"?([^"]+)"?/\1/p' "$repo/manifests/chart/preheat/Chart.yaml")"

# podman's settings for this host (the issue that brought in real nodes has the probe): crun refuses
# hybrid cgroups, there is no systemd, and the inherited open-file limit is refused by runc.
write_containers_conf() {
  local f=/etc/containers/containers.conf marker="# written by preheat cluster/images.sh"
  if [ -f "$f" ] && ! grep -qF "$marker" "$f"; then
    log "$f exists and is not ours: left as it is"; return
  fi
  mkdir -p /etc/containers
  cat > "$f" <<EOF
$marker
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
}

sha() { sha256sum | cut -c1-16; }

# The base rootfs tarball is cached in $PREHEAT_CACHE (podman's own storage may be wiped); its key is
# what went into it.
base_key() { printf '%s\n' "$BASE_SUITE" minbase "$BASE_PACKAGES" "$BASE_MIRROR" | sha; }
base_ref() { echo "localhost/preheat/base:$BASE_SUITE-$(base_key)"; }
build_base() {
  local ref tar
  ref="$(base_ref)"; tar="$out/base-$BASE_SUITE-$(base_key).tar"
  podman image exists "$ref" && { log "base $ref cached"; return; }
  if [ ! -s "$tar" ]; then
    local root
    root="$(mktemp -d "$out/rootfs.XXXXXX")"
    log "debootstrap --variant=minbase $BASE_SUITE (+$BASE_PACKAGES) from $BASE_MIRROR"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$BASE_SUITE" "$root" "$BASE_MIRROR" >"$out/debootstrap.log" 2>&1 \
      || { tail -20 "$out/debootstrap.log" >&2; rm -rf "$root"; exit 1; }
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$root" -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$root"
  fi
  podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$tar" "$ref" >/dev/null
  log "base $ref: $(du -h "$tar" | cut -f1) rootfs"
}

# The pause container: the static binary and nothing else.
build_pause() {
  local ref="localhost/preheat/pause:$KUBERNETES_VERSION" pause="$PREHEAT_CACHE/bin/pause"
  [ -x "$pause" ] || bash "$here/build-node.sh" pause
  if ! podman image exists "$ref"; then
    local c
    c="$(buildah from scratch)"
    buildah copy "$c" "$pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    buildah commit -q "$c" "$ref" >/dev/null
    buildah rm "$c" >/dev/null
  fi
  save "$ref" pause "$KUBERNETES_VERSION"
}

# Every file a Dockerfile COPYs from the context (not --from a stage), for the content hash; but the
# README, which only becomes the package's long description (pyproject's `readme`): editing the docs
# must not rebuild a 6 GB image.
copied_files() {
  local df="$1" ctx="$2"
  grep -E '^COPY ' "$df" | grep -v -- '--from' | awk '{for (i = 2; i < NF; i++) print $i}' | while read -r src; do
    [ "$src" = README.md ] && continue
    find "$ctx/$src" -type f ! -path '*/__pycache__/*' ! -name '*.pyc'
  done | sort
}

# image name, Dockerfile, extra build args...: builds FROM our base unless PYTHON_IMAGE/CUDA_IMAGE is given.
# The build context is the repository unless CONTEXT names another directory.
build_app() {
  local name="$1" df="$2"; shift 2
  local base args=("$@") key ref ctx="${CONTEXT:-$repo}"
  base="$(base_ref)"
  podman image exists "$base" || build_base
  key="$( { cat "$df"; printf '%s\n' "${args[@]}"; podman image inspect --format '{{.Id}}' "$base";
            copied_files "$df" "$ctx" | while read -r f; do echo "${f#"$repo"/}"; cat "$f"; done; } | sha)"
  ref="localhost/$name:$key"
  if podman image exists "$ref"; then
    log "$name $key cached"
  else
    # Older builds and the old archive go first: on a small disk a rebuild of the 6 GB model-server image
    # (build stage, image, archive) must not have to fit beside the old one.
    prune "$name" ""
    rm -f "$out/${name##*/}.tar" "$out/${name##*/}.tar.key"
    log "$name: podman build -f ${df#"$repo"/}"
    # pip inside the build uses this host's pip configuration and CA bundle, mounted for the RUN
    # steps only (nothing of the host is baked into the image); the host network reaches the index.
    local mounts=()
    for f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
      [ -f "$f" ] && mounts+=(--volume "$f:$f:ro")
    done
    podman build --network host --layers --force-rm "${mounts[@]}" --build-arg "PYTHON_IMAGE=$base" "${args[@]}" \
      -f "$df" -t "$ref" "$ctx"
    prune "$name" "$ref"
  fi
  podman tag "$ref" "docker.io/$name:$APP_VERSION" "docker.io/$name:dev"
  [ "${SAVE:-1}" = 1 ] || return 0
  save "$ref" "${name##*/}" "$key" "docker.io/$name:$APP_VERSION" "docker.io/$name:dev"
}

# The disk is the limit here (a model-server image and its build stage are 6 GB each): once an image is
# built, its older builds (other keys; kept if another image is built FROM them) and the dangling
# build stages go (--force-rm: a failed build leaves no working container either). A rebuild then starts
# from its base again.
prune() {
  local name="$1" keep="$2" old
  # Before a build (keep empty) the docker.io names go too: an image's layers are freed only with its
  # last name.
  if [ -z "$keep" ]; then
    for old in "docker.io/$name:dev" "docker.io/$name:$APP_VERSION"; do podman rmi "$old" >/dev/null 2>&1 || true; done
  fi
  podman images --format '{{.Repository}}:{{.Tag}}' "localhost/$name" | while read -r old; do
    [ "$old" = "$keep" ] || podman rmi "$old" >/dev/null 2>&1 || true
  done
  podman image prune -f >/dev/null 2>&1 || true
}

# Saves an image (under every name given) as a docker archive $out/<short>.tar with a .key beside it;
# the nodes import it into containerd at start (lab/preheat_cluster's realnode).
save() {
  local ref="$1" short="$2" key="$3"; shift 3
  local tar="$out/$short.tar"
  [ -s "$tar" ] && [ "$(cat "$tar.key" 2>/dev/null)" = "$key" ] && return
  podman save --format docker-archive -o "$tar.tmp" "$ref" "$@" 2>/dev/null || podman save -m --format docker-archive -o "$tar.tmp" "$ref" "$@"
  mv -f "$tar.tmp" "$tar"
  echo "$key" > "$tar.key"
  log "$short: $(du -h "$tar" | cut -f1) archive"
}

# A Dockerfile's default torch index (PyTorch's own wheel indexes) is not reachable from every machine;
# $2 (PREHEAT_TORCH_INDEX / PREHEAT_TORCH_CUDA_INDEX) picks another, else PyPI is used when the default
# does not answer. PyPI's torch is the CUDA build: on the CPU image it runs on CPU, but brings ~3 GB of
# NVIDIA libraries that libtorch_cpu links against, so the image is that much larger.
torch_index_args() {
  local df="$1" index="$2" default
  if [ -z "$index" ]; then
    default="$(sed -nE 's/^ARG TORCH_INDEX=(.*)/\1/p' "$df")"
    if ! curl -fsS -o /dev/null --max-time 15 "$default/torch/" 2>/dev/null; then
      index=https://pypi.org/simple
      log "${df#"$repo"/}: $default is not reachable; torch from $index (the CUDA build)"
    fi
  fi
  [ -z "$index" ] || echo "--build-arg TORCH_INDEX=$index"
}

build_model_server() {
  local df="$repo/model-server/Dockerfile" args
  read -r -a args <<< "$(torch_index_args "$df" "${PREHEAT_TORCH_INDEX:-}")"
  build_app preheat/model-server "$df" "${args[@]}"
}

# The CUDA image cannot run here (no GPU); it is built to show the Dockerfile builds, FROM the same
# debootstrapped Debian base in place of NVIDIA's CUDA runtime image (the registry is unreachable): the
# CUDA libraries come from PyPI with torch, as on the CPU image. Not saved for the nodes.
build_model_server_cuda() {
  local df="$repo/model-server/Dockerfile.cuda" args
  read -r -a args <<< "$(torch_index_args "$df" "${PREHEAT_TORCH_CUDA_INDEX:-}")"
  SAVE=0 build_app preheat/model-server-cuda "$df" --build-arg "CUDA_IMAGE=$(base_ref)" "${args[@]}"
}

# The tests' stand-in model server (lab/preheat_cluster/lightweight_server.py: health routes and request
# metrics, no model) on the operator image, which has its one dependency (prometheus-client): lab code,
# so its own build context, never the product's.
build_lightweight_server() {
  local operator
  podman image exists docker.io/preheat/operator:dev || build_app preheat/operator "$repo/operator/Dockerfile"
  operator="$(podman image inspect --format '{{.Id}}' docker.io/preheat/operator:dev)"
  CONTEXT="$repo/lab/preheat_cluster" build_app preheat/lightweight-server \
    "$repo/lab/preheat_cluster/lightweight-server.Dockerfile" --build-arg "OPERATOR_IMAGE=$operator"
}

main() {
  bash "$here/build-node.sh" packages
  write_containers_conf
  local targets=("$@")
  [ "${#targets[@]}" = 0 ] && targets=(all)
  for t in "${targets[@]}"; do
    case "$t" in
      base) timed build_base ;;
      pause) timed build_pause ;;
      operator) timed build_app preheat/operator "$repo/operator/Dockerfile" ;;
      model-server) timed build_model_server ;;
      model-server-cuda) timed build_model_server_cuda ;;
      lightweight-server) timed build_lightweight_server ;;
      all) timed build_base; timed build_pause; timed build_app preheat/operator "$repo/operator/Dockerfile"
           timed build_lightweight_server; timed build_model_server ;;
      *) echo "usage: $0 [all|base|pause|operator|lightweight-server|model-server|model-server-cuda]..." >&2; exit 2 ;;
    esac
  done
}
main "$@"
