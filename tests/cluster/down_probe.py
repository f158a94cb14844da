"""Run by test_cluster_down.py inside a network namespace of its own (a real-node cluster is one per
namespace): bring up a one-node cluster, run a pod whose process starts a child, then `preheat_cluster down`
in a separate process (as `make cluster-down` does), and print what was left as JSON on the last line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from preheat_cluster import LocalCluster, kubectl
from preheat_cluster.procs import alive, marked_pids
from preheat_cluster.realnode import cgroup_pids

SLEEPER = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": "default"}, "spec": {
    "containers": [{"name": "c", "image": "preheat/operator:dev", "imagePullPolicy": "Never",
                    # A child process too: down must catch grandchildren, not only what it started.
                    "command": ["python3", "-c",
                                "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"]}]}}


def main(state_dir: Path) -> dict:
    cluster = LocalCluster(state_dir=state_dir, nodes=1, node_images=("pause", "operator"))
    cluster.up(quiet=True)
    cgroup_root = cluster._fleet().nodes[0].cgroup_root
    in_pod: list[int] = []
    components: list[int] = []
    try:
        components = list(cluster.component_pids().values())
        deadline = time.monotonic() + 60
        while True:  # the default ServiceAccount is made by the controller-manager, just after start
            if kubectl(cluster, "get", "serviceaccount", "default", check=False):
                break
            assert time.monotonic() < deadline, "no default ServiceAccount"
            time.sleep(0.5)
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(SLEEPER))
        deadline = time.monotonic() + 120
        while kubectl(cluster, "get", "pod", "sleeper", "-o", "jsonpath={.status.phase}", check=False) != "Running":
            assert time.monotonic() < deadline, "the pod never ran"
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while len(in_pod := cgroup_pids(cgroup_root)) < 3:  # pause, the pod's process and its child
            assert time.monotonic() < deadline, f"expected the pod's processes in {cgroup_root}, found {in_pod}"
            time.sleep(0.25)
    finally:
        r = subprocess.run([sys.executable, "-m", "preheat_cluster", "--state-dir", str(cluster.state_dir), "down"],
                           capture_output=True, text=True, timeout=300)
    return {"down_rc": r.returncode, "down_stderr": r.stderr[-2000:], "components": components, "pod_pids": in_pod,
            "alive": [p for p in [*components, *in_pod] if alive(p)], "marked": marked_pids(cluster.cluster_id),
            "cgroup_pids_after": cgroup_pids(cgroup_root), "state_left": (cluster.state_dir / "state.json").exists(),
            "mounts_left": [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                            if ln.split()[4].startswith(str(cluster.state_dir))]}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
