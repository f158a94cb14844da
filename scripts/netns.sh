#!/usr/bin/env bash
# Runs a command inside a network namespace of Preheat's own: usage `scripts/netns.sh NAME CMD...`.
#
# Why: the API server refuses loopback addresses (127/8) in EndpointSlices, so local pods get
# addresses from 198.18.0.0/15 (RFC 2544's benchmarking range) made local by an AnyIP route on `lo`.
# That route, and every packet to a pod, must stay inside a test host we made ourselves, never on the
# machine's own network stack: so the whole local cluster, its pods, the tests and the demo run in
# this namespace, which has nothing but its own loopback device (no way out, by construction).
set -euo pipefail
name="$1"; shift
if [ -n "${PREHEAT_NETNS:-}" ]; then exec "$@"; fi   # already inside one
if ! ip netns list 2>/dev/null | grep -qE "^$name( |$)"; then
  if ! ip netns add "$name" 2>/tmp/preheat-netns-error; then
    echo "netns: cannot create network namespace $name ($(cat /tmp/preheat-netns-error)); needs root" \
         "(CAP_SYS_ADMIN). Running without it: pods get 127.x addresses and EndpointSlices stay empty." >&2
    exec "$@"
  fi
fi
ip -n "$name" link set lo up
ip -n "$name" route replace local 198.18.0.0/15 dev lo
export PREHEAT_NETNS="$name"
exec ip netns exec "$name" "$@"
