#!/usr/bin/env bash
# Everything CI runs: build what is missing, lint, then one pytest session (unit tests and the tests
# on the real local cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

# The Go builds and the venv are independent; on a fresh machine they are most of the run, so they
# go side by side. Both are idempotent and cached outside the repo.
start=$(date +%s)
# The peers (tests/cluster/test_peers.py: prometheus-adapter for the real HPA, AIBrix, KEDA) go after the
# cluster's binaries in the same job: one Go build at a time on a small machine. Cold, they add about
# 20 minutes on 2 cores (docs/cluster.md has the figures).
# The real nodes (tests/cluster/test_real_node.py): their Debian packages first and alone (apt's lock),
# the pause binary before the Go job (the images job needs it too), kubelet/kube-proxy/containerd/crictl/
# CoreDNS last in the Go job. The images (a debootstrapped base, the operator and CPU model-server images
# from their Dockerfiles) build beside the Go job once the venv is there: both mostly wait on the network
# and the disk when cold.
bash cluster/build-node.sh packages
bash cluster/build-node.sh pause
{ bash cluster/build-binaries.sh all && bash cluster/build-peers.sh prometheus-adapter \
    && bash cluster/build-peers.sh aibrix && bash cluster/build-peers.sh keda && bash cluster/build-node.sh all; } \
  > >(sed 's/^/[binaries] /') 2>&1 &
binaries_pid=$!
make --no-print-directory setup
images_start=$(date +%s)
bash cluster/images.sh all > >(sed 's/^\[images\] //; s/^/[images] /') 2>&1
echo "== images took $(( $(date +%s) - images_start )) s"
wait "$binaries_pid"
echo "== build and setup took $(( $(date +%s) - start )) s"
# Built above: a missing real-node piece fails its tests instead of skipping them.
export PREHEAT_REQUIRE_REAL_NODES=1

echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
# One pytest run, so the closing line counts every test; the session fixture brings the cluster up
# once for the tests marked 'cluster' and takes it down at the end.
# Everything from here runs in a network namespace of our own (scripts/netns.sh says why), deleted
# at the end with whatever was left in it.
ns="preheat-test-$$"
exec bash scripts/netns.sh --rm "$ns" bash -c \
  '"$0" -m pytest tests "$@"; rc=$?
   "$0" -m preheat_cluster ${PREHEAT_CLUSTER_DIR:+--state-dir "$PREHEAT_CLUSTER_DIR"} down >/dev/null 2>&1; exit $rc' "$PY" "$@"
