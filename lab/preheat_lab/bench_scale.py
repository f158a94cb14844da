"""Scale benchmark: N InferenceEndpoints (pods run the tiny mapped `preheat/lightweight-server`)
reconciled by one `preheat operator` process; records time to converge and the operator's memory.

    python -m preheat_lab.bench_scale --count 200 --out bench-results/operator-scale.json

Uses the local cluster in `--cluster-state` (default: the local cluster's own, `.cluster/`; brought up
if needed, taken down only if it started it), or `--kubeconfig`/`--prometheus-url` for another. Converged = every endpoint Ready=True with one
serving replica. Records, never asserts: the numbers go to JSON and docs/operator.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from preheat_server.hardware import machine_record


def _rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def _endpoint(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "preheat.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name},
        "spec": {
            "model": {"builtin": "tiny"},
            "server": {"image": "preheat/lightweight-server:dev", "drainTimeoutSeconds": 1},
            "scaling": {"minReplicas": 1, "maxReplicas": 2, "warmPool": {"min": 0, "max": 0},
                        "intervalSeconds": 15},
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--namespace", default="bench-scale")
    p.add_argument("--kubeconfig")
    p.add_argument("--prometheus-url")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--out", default="bench-results/operator-scale.json")
    p.add_argument("--cluster-state", type=Path, default=None, help="the local cluster's state dir (default: its own)")
    p.add_argument("--log", type=Path, default=Path("bench-results/tmp/operator-scale.log"), help="operator log")
    args = p.parse_args(argv)

    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    cluster, started = None, False
    if args.kubeconfig and args.prometheus_url:
        kubeconfig, prom = args.kubeconfig, args.prometheus_url
    else:
        from preheat_cluster import LocalCluster

        cluster = LocalCluster(state_dir=args.cluster_state) if args.cluster_state else LocalCluster()
        started = not cluster.is_up()
        if started:
            cluster.up()
        kubeconfig, prom = str(cluster.kubeconfig), cluster.prometheus_url
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = client.ApiClient(cfg)
    core, custom, ext = client.CoreV1Api(api), client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)

    from preheat.controller.crd import build_crd

    crd = build_crd()
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
    time.sleep(2)
    ns = args.namespace
    try:
        core.create_namespace({"metadata": {"name": ns}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    while True:
        try:
            core.read_namespaced_service_account("default", ns)
            break
        except ApiException:
            time.sleep(0.5)

    log_path = args.log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    with open(log_path, "w") as log:
        op = subprocess.Popen([sys.executable, "-m", "preheat", "operator", "--namespace", ns, "--prometheus-url", prom,
                               "--metrics-port", "0", "--log-format", "json"], stdout=log, stderr=subprocess.STDOUT,
                              env=env)
    result: dict[str, Any] = {"count": args.count, "host": platform.node(), "cpus": os.cpu_count(),
                              "machine": machine_record()}
    try:
        time.sleep(5)  # imports + first watch
        result["rss_idle_kib"] = _rss_kib(op.pid)
        t0 = time.monotonic()
        for i in range(args.count):
            custom.create_namespaced_custom_object("preheat.dev", "v1alpha1", ns, "inferenceendpoints",
                                                   _endpoint(f"ep-{i:03d}"))
        result["create_s"] = round(time.monotonic() - t0, 2)
        ready_at: dict[str, float] = {}
        objects_at: float | None = None
        while time.monotonic() - t0 < args.timeout:
            items = custom.list_namespaced_custom_object("preheat.dev", "v1alpha1", ns, "inferenceendpoints")["items"]
            for it in items:
                st = it.get("status") or {}
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
                if ready and st.get("servingReplicas") == 1 and it["metadata"]["name"] not in ready_at:
                    ready_at[it["metadata"]["name"]] = time.monotonic() - t0
            if objects_at is None:
                deps = client.AppsV1Api(api).list_namespaced_deployment(ns).items
                if len(deps) >= args.count:
                    objects_at = time.monotonic() - t0
            if len(ready_at) >= args.count:
                break
            if op.poll() is not None:
                raise RuntimeError(f"operator exited with {op.returncode}; see {log_path}")
            time.sleep(2)
        times = sorted(ready_at.values())
        result.update({
            "converged": len(ready_at),
            "deployments_created_s": round(objects_at, 1) if objects_at else None,
            "time_to_converge_s": round(times[-1], 1) if len(times) >= args.count else None,
            "p50_endpoint_ready_s": round(times[len(times) // 2], 1) if times else None,
            "rss_converged_kib": _rss_kib(op.pid),
        })
        time.sleep(30)  # a couple of loop periods at steady state
        result["rss_steady_kib"] = _rss_kib(op.pid)
    finally:
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(timeout=30)
        except subprocess.TimeoutExpired:
            op.kill()
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)
        if cluster is not None and started:
            cluster.down()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
