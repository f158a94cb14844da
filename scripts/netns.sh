#!/usr/bin/env bash
# Runs a command inside a network namespace of Preheat's own: usage `scripts/netns.sh [--rm] NAME CMD...`.
# With --rm the namespace is one-shot: when the command ends, whatever it left running in there is
# killed and the namespace deleted (tests, the demo, benchmarks); without it, it outlives the command
# (`make cluster-up`).
#
# Why: the local cluster's real nodes put addresses on `lo` (node IPs, the API server's advertised
# address), make bridges for their pods and rewrite iptables (kube-proxy). All of that, and every packet
# to a pod, must stay inside a test host we made ourselves, never on the machine's own network stack:
# so the whole local cluster, its pods, the tests and the demo run in this namespace, which has nothing
# but its own loopback device and the nodes' bridges (no way out, by construction).
set -euo pipefail
rm=0
if [ "${1:-}" = "--rm" ]; then rm=1; shift; fi
name="$1"; shift
if [ -n "${PREHEAT_NETNS:-}" ]; then exec "$@"; fi   # already inside one
if ! ip netns list 2>/dev/null | grep -qE "^$name( |$)"; then
  if ! ip netns add "$name" 2>/tmp/preheat-netns-error; then
    echo "netns: cannot create network namespace $name ($(cat /tmp/preheat-netns-error)); needs root" \
         "(CAP_SYS_ADMIN). Running without it: the local cluster's real nodes refuse to start outside one." >&2
    exec "$@"
  fi
fi
ip -n "$name" link set lo up
export PREHEAT_NETNS="$name"
if [ "$rm" = 0 ]; then exec ip netns exec "$name" "$@"; fi
set +e
ip netns exec "$name" "$@"
rc=$?
ip netns pids "$name" 2>/dev/null | xargs -r kill -9 2>/dev/null
ip netns del "$name" 2>/dev/null
exit $rc
