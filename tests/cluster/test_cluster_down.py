"""`preheat-cluster down` (what `make cluster-down` runs) leaves none of the cluster's processes running.

Uses a second cluster of its own (another state dir, other ports, other pod IP range), so the session's
shared cluster stays up for the other tests."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kubernetes import client, config
from preheat_cluster import LocalCluster, missing_binaries
from preheat_cluster.procs import alive, marked_pids

pytestmark = pytest.mark.cluster


def test_cluster_down_leaves_no_process_running(tmp_path, local_cluster) -> None:
    # local_cluster is requested so this runs with the other cluster tests; it is not touched.
    second = LocalCluster(state_dir=tmp_path / "second-cluster")
    if missing_binaries(second.bin_dir):
        pytest.fail(f"missing binaries {missing_binaries(second.bin_dir)}: run `make binaries`")
    second.up(quiet=True)
    pids: set[int] = set()
    try:
        if local_cluster.cluster is not None:
            assert second.ports["apiserver"] != local_cluster.cluster.ports["apiserver"]
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(second.kubeconfig), client_configuration=cfg)
        core = client.CoreV1Api(client.ApiClient(cfg))
        deadline = time.monotonic() + 60
        while True:  # the default ServiceAccount is made by the controller-manager, just after start
            try:
                core.read_namespaced_service_account("default", "default")
                break
            except client.ApiException:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        core.create_namespaced_pod("default", {"metadata": {"name": "sleeper"}, "spec": {"containers": [{
            "name": "c", "image": "python:3.11-slim",
            # A child process too: down must catch grandchildren, not only the processes it started.
            "command": ["python", "-c", "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"]}]}})
        deadline = time.monotonic() + 60
        while core.read_namespaced_pod("sleeper", "default").status.phase != "Running":
            assert time.monotonic() < deadline, "pod never ran"
            time.sleep(0.25)
        # etcd, apiserver, controller-manager, scheduler, agent, Prometheus, the pod and its child.
        deadline = time.monotonic() + 30
        while len(pids := set(marked_pids(second.cluster_id))) < 8:
            assert time.monotonic() < deadline, f"expected 8 marked processes, found {pids}"
            time.sleep(0.25)
        components = set(second.component_pids().values())
        assert components <= pids and len(components) == 6
    finally:
        r = subprocess.run([sys.executable, "-m", "preheat_cluster", "--state-dir", str(second.state_dir), "down"],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not [p for p in pids if alive(p)]
    assert marked_pids(second.cluster_id) == []
    assert not (second.state_dir / "state.json").exists() and not (second.state_dir / "etcd").exists()
