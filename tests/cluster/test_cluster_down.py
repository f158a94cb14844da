"""`preheat-cluster down` (what `make cluster-down` runs) leaves nothing of a real-node cluster behind: no
component, no pod process (nor its child), nothing in the node's cgroups, no mount under its state dir.

A real-node cluster is one per network namespace (kube-proxy's chains, the node addresses on lo), so the
second cluster runs in a namespace of its own (scripts/netns.sh), through down_probe.py; the session's
shared cluster stays up for the other tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


def test_cluster_down_leaves_nothing_of_a_real_node_cluster(local_cluster) -> None:
    # local_cluster is requested so this runs with the other cluster tests (their binaries and images).
    env = {k: v for k, v in os.environ.items() if k != "PREHEAT_NETNS"}  # else netns.sh stays in ours
    # A short state dir: the nodes' unix sockets live under it (108 bytes at most), and pytest's tmp_path
    # is deep. `down` removes it; the finally makes sure.
    state = Path(tempfile.mkdtemp(prefix="phdown-", dir="/tmp"))
    try:
        r = subprocess.run(["bash", str(REPO / "scripts" / "netns.sh"), "--rm", f"preheat-down-{os.getpid()}",
                            sys.executable, str(Path(__file__).with_name("down_probe.py")), str(state / "c")],
                           capture_output=True, text=True, timeout=600, env=env)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["down_rc"] == 0, got["down_stderr"]
    assert len(got["components"]) >= 8 and len(got["pod_pids"]) >= 3, got
    assert got["alive"] == [] and got["marked"] == [] and got["cgroup_pids_after"] == [], got
    assert not got["state_left"] and got["mounts_left"] == [], got
