"""Benchmark of the local cluster: start-to-ready time, and how long a Deployment of N lightweight
pods takes to be Ready (and to scale back to zero) with the nodes' CPU cost (kubelets and containerd),
written as JSON.

    bash scripts/netns.sh --rm preheat-bench .venv/bin/python -m preheat_lab.bench_cluster --pods 100

Starts its own cluster in a temporary state dir (`make bench-cluster` gives it its own network
namespace: one real-node cluster per namespace), so it never touches `.cluster/`."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from kubernetes import client, config
from preheat_cluster import LocalCluster
from preheat_server.hardware import machine_record


def _cpu_s(pids: list[int]) -> float:
    # utime + stime of the processes and their waited-for children, in seconds.
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _ready_count(core: client.CoreV1Api, ns: str) -> int:
    pods = core.list_namespaced_pod(ns, label_selector="app=bench").items
    return sum(1 for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=100, help="lightweight pods (a node holds 110 by default)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/cluster.json"))
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="preheat-bench-") as tmp:
        cluster = LocalCluster(state_dir=Path(tmp) / "cluster")
        result: dict = {"pods": args.pods, "cpu_count": os.cpu_count(), "machine": machine_record()}
        try:
            result["start_to_ready_s"] = round(cluster.up(quiet=True), 2)
            cfg = client.Configuration()
            config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
            api = client.ApiClient(cfg)
            core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
            agent = [pid for name, pid in cluster.component_pids().items()
                     if name.startswith(("kubelet-", "containerd-"))]
            cpu0 = _cpu_s(agent)
            t0 = time.monotonic()
            apps.create_namespaced_deployment("default", {
                "metadata": {"name": "bench"},
                "spec": {"replicas": args.pods, "selector": {"matchLabels": {"app": "bench"}}, "template": {
                    "metadata": {"labels": {"app": "bench"}},
                    "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                        "name": "s", "image": "preheat/lightweight-server:dev", "imagePullPolicy": "Never",
                        "readinessProbe": {"httpGet": {"path": "/health/ready", "port": 8000}, "periodSeconds": 5}}]}}}})
            n = 0
            while time.monotonic() - t0 < args.timeout_s:
                n = _ready_count(core, "default")
                if n >= args.pods:
                    break
                time.sleep(1)
            result["all_ready_s"] = round(time.monotonic() - t0, 1)
            result["ready"] = n
            result["nodes_cpu_s_scale_up"] = round(_cpu_s(agent) - cpu0, 1)
            cpu1 = _cpu_s(agent)
            time.sleep(30)
            result["nodes_cpu_s_per_30s_idle_with_pods"] = round(_cpu_s(agent) - cpu1, 2)
            t1 = time.monotonic()
            apps.patch_namespaced_deployment_scale("bench", "default", {"spec": {"replicas": 0}})
            while time.monotonic() - t1 < args.timeout_s and core.list_namespaced_pod("default",
                                                                                       label_selector="app=bench").items:
                time.sleep(1)
            result["scale_to_zero_s"] = round(time.monotonic() - t1, 1)
        finally:
            cluster.down(quiet=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
