"""The local cluster on its real nodes, as the tests above it use it: a Deployment spread over both nodes
with pod IPs, EndpointSlices and scaling; the CRD's schema and CEL rules; Prometheus discovering pods and
scraping host targets across a restart. What Kubernetes itself does on a kubelet (graceful deletion,
back-off, probes, the downward API) is its own tested behaviour; test_real_node.py checks the nodes'
isolation, limits, Services, DNS, Pod Security, in-place resize and node loss."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.cluster


# ----- helpers ------------------------------------------------------------------------------------
def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25) -> Any:
    """Poll `fn` until it returns something truthy; fail with `what` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except ApiException as e:
            last = e
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def http_get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def ready(pod: client.V1Pod) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def ready_pods(core: client.CoreV1Api, ns: str, selector: str, n: int) -> list[client.V1Pod] | None:
    pods = [p for p in core.list_namespaced_pod(ns, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]
    return pods if len(pods) == n and all(ready(p) for p in pods) else None


@pytest.fixture
def core(kube_api) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


# ----- a Deployment across the nodes: pod IPs, EndpointSlice, scaling --------------------------------
def test_deployment_spreads_over_both_nodes_and_its_endpointslice_follows_scaling(core, kube_api, namespace,
                                                                                  local_cluster) -> None:
    from preheat_cluster.realnode import POD_CIDR

    apps = client.AppsV1Api(kube_api)
    disc = client.DiscoveryV1Api(kube_api)
    labels = {"app": "web"}
    core.create_namespaced_service(namespace, {
        "metadata": {"name": "web"}, "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8000}]}})
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 5,
                     "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                    "whenUnsatisfiable": "DoNotSchedule",
                                                    "labelSelector": {"matchLabels": labels}}],
                     "containers": [{
                         "name": "http", "image": "preheat/lightweight-server:dev", "imagePullPolicy": "Never",
                         "ports": [{"name": "http", "containerPort": 8000}],
                         "readinessProbe": {"httpGet": {"path": "/health/ready", "port": "http"}, "periodSeconds": 1},
                     }]}}}})
    pods = wait_for("2 ready pods", lambda: ready_pods(core, namespace, "app=web", 2), 120)
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2 and len({p.spec.node_name for p in pods}) == 2, "not one pod per node"
    if local_cluster.cluster is not None:
        assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(POD_CIDR) for ip in ips)
    for p in pods:  # each reached on its own IP from outside the pod (the node's bridge, not loopback)
        assert http_get(f"http://{p.status.pod_ip}:8000/health/ready")[0] == 200

    def slice_ips(want: set[str]) -> Callable[[], set[str] | None]:
        def got() -> set[str] | None:
            slices = disc.list_namespaced_endpoint_slice(namespace, label_selector="kubernetes.io/service-name=web").items
            have = {a for s in slices for e in s.endpoints or [] if e.conditions.ready for a in e.addresses}
            return have if have == want else None
        return got

    wait_for("the Service's EndpointSlice to list both pods", slice_ips(ips), 60)
    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 4}})
    pods4 = wait_for("4 ready pods", lambda: ready_pods(core, namespace, "app=web", 4), 120)
    assert len({p.status.pod_ip for p in pods4}) == 4
    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 1}})
    pods1 = wait_for("1 ready pod left", lambda: ready_pods(core, namespace, "app=web", 1), 120)
    wait_for("the EndpointSlice to shrink to the kept pod", slice_ips({pods1[0].status.pod_ip}), 60)
    gone = {p.status.pod_ip for p in pods4} - {pods1[0].status.pod_ip}
    wait_for("the removed pods to stop answering", lambda: all(http_get(f"http://{ip}:8000/health/live", 1)[0] == 0
                                                               for ip in gone), 60, interval=1)


def test_crd_schema_and_cel_rule_reject_invalid_objects(kube_api, namespace) -> None:
    ext = client.ApiextensionsV1Api(kube_api)
    group, plural = "foundation.preheat.dev", f"widgets{namespace.replace('-', '')}"
    name = f"{plural}.{group}"
    ext.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": name},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": plural[:-1], "kind": "Widget" + namespace[-6:].capitalize()},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {
                         "type": "object", "required": ["minReplicas", "maxReplicas"],
                         "x-kubernetes-validations": [{"rule": "self.minReplicas <= self.maxReplicas",
                                                       "message": "minReplicas must not exceed maxReplicas"}],
                         "properties": {"minReplicas": {"type": "integer", "minimum": 0},
                                        "maxReplicas": {"type": "integer"}}}}}}}]}})
    try:
        wait_for("the CRD to be Established", lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(name).status.conditions or []), 30)
        co = client.CustomObjectsApi(kube_api)
        kind = ext.read_custom_resource_definition(name).spec.names.kind

        def create(spec: dict) -> Any:
            return co.create_namespaced_custom_object(group, "v1", namespace, plural, {
                "apiVersion": f"{group}/v1", "kind": kind, "metadata": {"generateName": "w-"}, "spec": spec})

        # The API server can take a moment to serve a just-established CRD.
        wait_for("the CRD to be served", lambda: create({"minReplicas": 1, "maxReplicas": 2}), 30)
        with pytest.raises(ApiException) as e:
            create({"minReplicas": 5, "maxReplicas": 2})
        assert e.value.status == 422
        assert "minReplicas must not exceed maxReplicas" in e.value.body
        with pytest.raises(ApiException) as e:
            create({"minReplicas": -1, "maxReplicas": 2})
        assert e.value.status == 422 and "spec.minReplicas" in e.value.body
    finally:
        ext.delete_custom_resource_definition(name)


# ----- Prometheus ---------------------------------------------------------------------------------
def prom_query(url: str, q: str) -> list[dict]:
    code, body = http_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    assert code == 200, body
    return json.loads(body)["data"]["result"]


def test_prometheus_discovers_pods_and_scrapes_their_counter(core, kube_api, namespace, local_cluster) -> None:
    apps = client.AppsV1Api(kube_api)
    labels = {"app": "lw", "preheat.dev/endpoint": "ep1", "preheat.dev/role": "serving"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "lw"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "lw"}}, "template": {
            "metadata": {"labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}},
            "spec": {"containers": [{"name": "server", "image": "preheat/lightweight-server:dev",
                                     "readinessProbe": {"httpGet": {"path": "/health/ready", "port": 8000},
                                                        "periodSeconds": 1}}]}}}})
    pods = wait_for("2 ready lightweight servers", lambda: ready_pods(core, namespace, "app=lw", 2), 90)
    sent = {}
    for n, p in zip((3, 5), pods, strict=True):
        for _ in range(n):
            req = urllib.request.Request(f"http://{p.status.pod_ip}:8000/v1/completions", data=b"{}", method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200
        sent[p.metadata.name] = n

    def scraped() -> dict[str, float] | None:
        res = prom_query(local_cluster.prometheus_url, f'preheat:requests_received_total{{namespace="{namespace}"}}')
        got = {r["metric"]["pod"]: float(r["value"][1]) for r in res}
        return res if got == sent else None

    res = wait_for("Prometheus to scrape both pods' counters", scraped, 90, interval=1)
    for r in res:
        assert r["metric"]["endpoint"] == "ep1" and r["metric"]["role"] == "serving"


def test_prometheus_scrapes_host_processes_and_keeps_history_across_restart(local_cluster, tmp_path) -> None:
    cluster = local_cluster.cluster
    if cluster is None:
        pytest.fail("this test drives the local cluster's Prometheus (not available on an external cluster)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "preheat_cluster.lightweight_server", "--port", str(port)],
                            env={**os.environ, "POD_IP": "127.0.0.1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    name = f"host-{port}"
    try:
        cluster.register_scrape_target(name, f"127.0.0.1:{port}", {"namespace": "host", "endpoint": name})
        q = f'up{{instance_name="{name}"}}'
        wait_for("the host target to be scraped", lambda: [r for r in prom_query(local_cluster.prometheus_url, q)
                                                           if r["value"][1] == "1"], 60, interval=1)
        cluster.stop_prometheus()
        assert http_get(f"{local_cluster.prometheus_url}/-/ready")[0] == 0
        cluster.start_prometheus(wait=True)
        # The samples taken before the restart are still there (same data dir).
        hist = wait_for("pre-restart samples", lambda: prom_query(local_cluster.prometheus_url, f"{q}[10m]"), 30)
        assert len(hist[0]["values"]) >= 1
    finally:
        cluster.unregister_scrape_target(name)
        proc.terminate()
        proc.wait(timeout=10)
