"""Pod addresses. Pods need their own IPs on this host, and the API server refuses loopback addresses
(127/8) in EndpointSlices, so pods get addresses from 198.18.0.0/15 (RFC 2544's benchmarking range,
never routed) made local by one AnyIP route: `ip route add local 198.18.0.0/15 dev lo`. Traffic to
them never leaves the host's loopback device. Each cluster takes a /20 block of it (4094 pods),
claimed in a registry under the temp dir so two clusters never share one. Without CAP_NET_ADMIN to
add the route, pods fall back to 127.<n>.0.0/16: everything works except EndpointSlices, and `up`
says so."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import socket
import subprocess
import tempfile
from pathlib import Path

ANYIP_RANGE = ipaddress.ip_network("198.18.0.0/15")
BLOCK_PREFIX = 20
_REGISTRY = Path(tempfile.gettempdir()) / "preheat-pod-cidrs"


def _bindable(ip: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def ensure_anyip_route() -> tuple[bool, str]:
    """Make 198.18.0.0/15 local (idempotent); returns (ok, why not)."""
    probe = str(ANYIP_RANGE.network_address + 1)
    if _bindable(probe):
        return True, ""
    # The route goes only into a network namespace of our own (scripts/netns.sh creates it and sets
    # PREHEAT_NETNS), never into the machine's: pod traffic must stay inside a test host we made.
    if not os.environ.get("PREHEAT_NETNS"):
        return False, ("not inside Preheat's network namespace: run through `scripts/netns.sh NAME ...` "
                       "(make cluster-up/test/demo do) to give pods EndpointSlice-valid addresses")
    try:
        r = subprocess.run(["ip", "route", "add", "local", str(ANYIP_RANGE), "dev", "lo"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot run `ip route add local {ANYIP_RANGE} dev lo`: {e}"
    if _bindable(probe):
        return True, ""
    return False, f"`ip route add local {ANYIP_RANGE} dev lo` failed: {r.stderr.strip() or r.returncode}"


def _owner_alive(path: Path) -> bool:
    """A claim is live while its cluster's state.json lists a process that is still running."""
    try:
        owner = Path(path.read_text().strip())
        pids = json.loads((owner / "state.json").read_text()).get("pids", {}).values()
    except (OSError, ValueError):
        return False
    return any(os.path.exists(f"/proc/{int(p)}") for p in pids)


def claim_block(state_dir: Path) -> str:
    """Claim a free /20 of the AnyIP range for the cluster in `state_dir`; returns its CIDR."""
    _REGISTRY.mkdir(parents=True, exist_ok=True)
    for f in _REGISTRY.iterdir():
        try:
            if f.read_text().strip() == str(state_dir):
                return f.name.replace("_", "/")  # already ours (idempotent)
        except OSError:
            continue
    blocks = list(ANYIP_RANGE.subnets(new_prefix=BLOCK_PREFIX))
    random.shuffle(blocks)
    for block in blocks:
        f = _REGISTRY / str(block).replace("/", "_")
        if f.exists():
            if _owner_alive(f):
                continue
            f.unlink(missing_ok=True)  # its cluster is gone
        try:
            fd = os.open(f, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(state_dir))
        return str(block)
    raise RuntimeError(f"every /{BLOCK_PREFIX} of {ANYIP_RANGE} is claimed by a live cluster")


def release_block(state_dir: Path, cidr: str | None) -> None:
    if not cidr:
        return
    f = _REGISTRY / cidr.replace("/", "_")
    try:
        if f.read_text().strip() == str(state_dir):
            f.unlink()
    except FileNotFoundError:
        pass


def loopback_fallback_cidr(used: set[str]) -> str:
    free = [f"127.{o}.0.0/16" for o in range(10, 250) if f"127.{o}.0.0/16" not in used]
    return random.choice(free)


def choose_pod_cidr(state_dir: Path) -> tuple[str, str]:
    """(pod CIDR, warning or ''): an AnyIP block when possible, else a loopback /16."""
    ok, why = ensure_anyip_route()
    if ok:
        return claim_block(state_dir), ""
    used = set()
    for p in state_dir.parent.glob("*/state.json"):
        try:
            used.add(json.loads(p.read_text()).get("pod_cidr"))
        except (OSError, ValueError):
            continue
    return loopback_fallback_cidr(used), (
        f"{why}; pods get loopback addresses, which the API server refuses in EndpointSlices "
        "(Services will have no endpoints)")
