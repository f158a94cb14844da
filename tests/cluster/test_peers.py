"""The autoscalers Preheat is compared with, scaling the model server on the local cluster (issue 18).

- The real HPA (kube-controller-manager's, every setting its default) reads the model server's request
  rate from Prometheus through the real prometheus-adapter v0.12.0 behind the API server's aggregation
  layer.
- A KEDA v2.21.0 ScaledObject with a `prometheus` trigger on Preheat's own rate query: keda-operator
  creates the HPA, which reads the query's value through keda-adapter (external.metrics.k8s.io).
- An AIBrix v0.7.0 PodAutoscaler (KPA) on `vllm:num_requests_running`, scraped from each pod by the
  PodAutoscaler controller itself.

Each peer's binary comes from cluster/build-peers.sh (scripts/test.sh builds all three); a missing one
fails its test with the command that builds it."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from preheat.controller.builders import LABEL_ROLE, ROLE_SERVING, common_labels, pod_template
from preheat.controller.spec import InferenceEndpointSpec

pytestmark = pytest.mark.cluster

METRIC = "preheat:requests_received_per_second"  # the adapter's name for preheat:requests_received_total
# The per-replica request rate the HPA aims at: below what three closed-loop clients get from one tiny
# model-server replica on a loaded 2-core box (~1.2 req/s measured), so it must scale up.
TARGET_PER_REPLICA = 0.5


def wait_for(what: str, fn: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Poll `fn` until it returns something truthy; fail with `what` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except client.ApiException as e:
            last = e
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def ready(pod: client.V1Pod) -> bool:
    return pod.metadata.deletion_timestamp is None and pod.status.pod_ip is not None and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _model_server_deployment(name: str) -> dict:
    """A Deployment of the model server with the pod template Preheat's builder makes for the tiny
    model (same image, args, probes, scrape annotations). No operator runs here, so every replica
    serves: the role label says so rather than the builder's "warm" for not-yet-promoted pods."""
    tpl = pod_template(name, InferenceEndpointSpec.model_validate({"model": {"builtin": "tiny"}}))
    tpl["metadata"]["labels"][LABEL_ROLE] = ROLE_SERVING
    return {"metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": common_labels(name)}, "template": tpl}}


def _hpa(name: str, target_per_replica: str) -> dict:
    """autoscaling/v2 on a Pods metric with an AverageValue target, as the HPA walkthrough writes a
    per-pod rate (packets-per-second); min/max replicas aside, everything is the HPA's default
    (no behavior: scale up by max(100 %, 4 pods) per 15 s, down after a 300 s stabilization window)."""
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "minReplicas": 1, "maxReplicas": 3,
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": METRIC},
                         "target": {"type": "AverageValue", "averageValue": target_per_replica}}}]}}


class _Traffic:
    """Closed-loop clients sending completions to the Deployment's ready pods until stopped."""

    def __init__(self, core: client.CoreV1Api, ns: str, selector: str, clients: int = 3):
        self.core, self.ns, self.selector = core, ns, selector
        self.stop = threading.Event()
        self.sent = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> _Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self, i: int) -> None:
        body = json.dumps({"prompt": "hello", "max_tokens": 4}).encode()
        pods: list[client.V1Pod] = []
        listed = 0.0
        while not self.stop.is_set():
            # The pod list at most every 2 s: a list per request would put the API server's latency
            # between requests and leave the replica idle part of the time on a loaded machine.
            if not pods or time.monotonic() - listed > 2:
                pods = [p for p in self.core.list_namespaced_pod(self.ns, label_selector=self.selector).items
                        if ready(p)]
                listed = time.monotonic()
            for p in pods[i % max(len(pods), 1):][:1]:
                req = urllib.request.Request(f"http://{p.status.pod_ip}:8000/v1/completions", data=body,
                                             method="POST", headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        r.read()
                    self.sent += 1
                except OSError:
                    pods = []  # a pod going away: list the live ones again
            if not pods:
                self.stop.wait(0.5)


def test_real_hpa_scales_model_server_on_request_rate_through_prometheus_adapter(
        local_cluster, kube_api, namespace) -> None:
    from preheat_cluster.launcher import kubectl
    from preheat_cluster.peers import request_rate_rules, start_prometheus_adapter

    cluster = _cluster(local_cluster)
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    name = "hpa-tiny"
    selector = ",".join(f"{k}={v}" for k, v in common_labels(name).items())
    start = lambda: start_prometheus_adapter(cluster, request_rate_rules())  # noqa: E731
    with _under_load(kube_api, namespace, name, start) as traffic:
        # The custom metrics API answers from Prometheus data: the adapter's rate for the pod.
        # NotFound (empty output) until the adapter's series list holds the pod's: it lists at start and
        # every --metrics-relist-interval (1m), and Prometheus may not have scraped the pod at its start.
        def metric_values() -> list[dict] | None:
            sel = urllib.parse.quote(selector)
            raw = kubectl(cluster, "get", "--raw",
                          f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/{METRIC}?labelSelector={sel}",
                          check=False)
            items = json.loads(raw)["items"] if raw.strip() else []
            return items if items and all(float(_quantity(i["value"])) > 0 for i in items) else None

        values = wait_for(f"custom.metrics.k8s.io to serve {METRIC} > 0 for the pod", metric_values, 180, interval=2)
        assert {i["describedObject"]["kind"] for i in values} == {"Pod"}

        client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
            "autoscaling", "v2", namespace, "horizontalpodautoscalers", _hpa(name, f"{int(TARGET_PER_REPLICA * 1000)}m"))

        def scaled_up() -> dict | None:
            hpa = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
                "autoscaling", "v2", namespace, "horizontalpodautoscalers", name)
            dep = apps.read_namespaced_deployment(name, namespace)
            st = hpa.get("status", {})
            return hpa if st.get("desiredReplicas", 0) > 1 and dep.spec.replicas > 1 else None

        hpa = wait_for("the HPA to scale the Deployment above 1 replica", scaled_up, 240, interval=2)
        assert traffic.sent > 0
    st = hpa["status"]
    print(f"HPA: {st.get('currentReplicas')} -> {st.get('desiredReplicas')} replicas, "
          f"current {st['currentMetrics']}, conditions {[(c['type'], c['reason']) for c in st['conditions']]}")
    conds = {c["type"]: c for c in st["conditions"]}
    # Why it scaled, in the HPA's own words: it could read the metric and act on it.
    assert conds["ScalingActive"]["status"] == "True" and conds["ScalingActive"]["reason"] == "ValidMetricFound", conds
    assert conds["AbleToScale"]["status"] == "True", conds
    current = st["currentMetrics"][0]["pods"]
    assert current["metric"]["name"] == METRIC
    assert _quantity(current["current"]["averageValue"]) > TARGET_PER_REPLICA, current
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    assert any(e.reason == "SuccessfulRescale" and METRIC in (e.message or "") for e in events), \
        [(e.reason, e.message) for e in events]


def _quantity(q: str) -> float:
    """A Kubernetes quantity as the metrics APIs write it ("1500m", "2", "3k")."""
    from kubernetes.utils.quantity import parse_quantity
    return float(parse_quantity(q))


@contextlib.contextmanager
def _under_load(kube_api, namespace: str, name: str, start: Callable[[], Any]) -> Iterator[_Traffic]:
    """The model server's Deployment `name` with one Ready replica, closed-loop traffic at it, then the
    peer started by `start` (a ClusterError, e.g. a missing binary, fails the test with its message);
    the traffic runs until the block ends."""
    from preheat_cluster import ClusterError

    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    selector = ",".join(f"{k}={v}" for k, v in common_labels(name).items())
    apps.create_namespaced_deployment(namespace, _model_server_deployment(name))
    wait_for("the model server's first replica Ready",
             lambda: [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items if ready(p)], 240)
    with _Traffic(core, namespace, selector) as traffic:
        try:
            start()
        except ClusterError as e:
            pytest.fail(str(e), pytrace=False)
        yield traffic


def _events(core: client.CoreV1Api, namespace: str, name: str, kind: str) -> list[client.CoreV1Event]:
    """The Events about the object `kind`/`name` in `namespace`."""
    return core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},involvedObject.kind={kind}").items


def _new_size(message: str | None) -> int:
    """The replica count in "New size: 2; reason: ..." (AIBrix) or "Scaled up replica set X from 1 to 2"
    / "... to 2" (the Deployment controller); 0 when the message has none."""
    m = re.search(r"New size: (\d+)", message or "") or re.search(r"to (\d+)\b", message or "")
    return int(m.group(1)) if m else 0


def _cluster(local_cluster):
    if local_cluster.cluster is None:
        pytest.fail("this test runs a peer beside the local cluster (not on an external cluster)")
    return local_cluster.cluster


def test_keda_scaledobject_scales_model_server_on_preheats_rate_query(local_cluster, kube_api, namespace) -> None:
    from preheat.controller.observe import default_queries
    from preheat.controller.spec import PrometheusSpec
    from preheat_cluster.launcher import kubectl
    from preheat_cluster.peers_keda import scaled_object, start_keda

    cluster = _cluster(local_cluster)
    name = "keda-tiny"
    # Preheat's own stable-window rate query for this endpoint (operator/preheat/controller/observe.py).
    p = PrometheusSpec()
    query = default_queries(namespace, name, p.window, p.panic_window)["rate"]
    apps, custom = client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)
    with _under_load(kube_api, namespace, name, lambda: start_keda(cluster)) as traffic:
        custom.create_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", scaled_object(
            name, query=query, threshold=str(TARGET_PER_REPLICA), server_address=cluster.prometheus_url))

        # The external metrics API answers through keda-adapter -> keda-operator (gRPC) -> Prometheus.
        def metric_value() -> float | None:
            sel = urllib.parse.quote(f"scaledobject.keda.sh/name={name}")
            raw = kubectl(cluster, "get", "--raw",
                          f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/s0-prometheus?labelSelector={sel}",
                          check=False)
            items = json.loads(raw)["items"] if raw.strip() else []
            v = _quantity(items[0]["value"]) if items else 0.0
            return v if v > 0 else None

        wait_for("external.metrics.k8s.io to serve s0-prometheus > 0 for the ScaledObject", metric_value, 180, interval=2)

        def scaled_up() -> dict | None:
            try:
                hpa = custom.get_namespaced_custom_object(
                    "autoscaling", "v2", namespace, "horizontalpodautoscalers", f"keda-hpa-{name}")
            except client.ApiException as e:
                if e.status == 404:
                    return None
                raise
            dep = apps.read_namespaced_deployment(name, namespace)
            return hpa if hpa.get("status", {}).get("desiredReplicas", 0) > 1 and dep.spec.replicas > 1 else None

        hpa = wait_for("KEDA's HPA to scale the Deployment above 1 replica", scaled_up, 240, interval=2)
        assert traffic.sent > 0
        # KEDA's own loop (every pollingInterval, 30 s) finds the trigger active; the HPA may have
        # scaled before its first poll.
        def so_conditions() -> dict | None:
            so = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects", name)
            c = {c["type"]: c for c in so.get("status", {}).get("conditions", [])}
            return c if c.get("Active", {}).get("status") == "True" else None

        so_conds = wait_for("the ScaledObject Active", so_conditions, 90, interval=2)
    st = hpa["status"]
    print(f"KEDA: ScaledObject {[(c['type'], c['status'], c.get('reason')) for c in so_conds.values()]}; "
          f"HPA {st.get('currentReplicas')} -> {st.get('desiredReplicas')}, current {st['currentMetrics']}")
    assert so_conds["Ready"]["status"] == "True", so_conds
    # KEDA made the HPA: owned by the ScaledObject, an External metric per trigger, the threshold as the
    # per-replica AverageValue target.
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "ScaledObject"
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "External" and metric["external"]["metric"]["name"] == "s0-prometheus", metric
    assert _quantity(metric["external"]["target"]["averageValue"]) == pytest.approx(TARGET_PER_REPLICA)
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["ScalingActive"]["status"] == "True" and conds["ScalingActive"]["reason"] == "ValidMetricFound", conds
    current = st["currentMetrics"][0]["external"]
    assert _quantity(current["current"]["averageValue"]) > TARGET_PER_REPLICA, current
    events = client.CoreV1Api(kube_api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name=keda-hpa-{name}").items
    assert any(e.reason == "SuccessfulRescale" and "s0-prometheus" in (e.message or "") for e in events), \
        [(e.reason, e.message) for e in events]


def test_aibrix_podautoscaler_scales_model_server_on_vllm_num_requests_running(
        local_cluster, kube_api, namespace) -> None:
    from preheat_cluster.peers_aibrix import AIBRIX, pod_autoscaler, start_aibrix
    from preheat_cluster.procs import log_tail

    cluster = _cluster(local_cluster)
    name = "aibrix-tiny"
    core, custom = client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api)
    # Three closed-loop clients on one replica keep about 2 requests running (the tiny model's batch):
    # twice the target of 1 per replica, which AIBrix's KPA answers by scaling up.
    with _under_load(kube_api, namespace, name, lambda: start_aibrix(cluster)) as traffic:
        custom.create_namespaced_custom_object("autoscaling.aibrix.ai", "v1alpha1", namespace, "podautoscalers",
                                               pod_autoscaler(name, metric="num_requests_running", target="1"))

        def scaled_up() -> dict | None:
            # From the Events, not a sample of the state: the KPA may scale 1 -> 2 and back between two
            # polls (its panic window reacts within seconds), and the Events keep what it did.
            pa_events = _events(core, namespace, name, "PodAutoscaler")
            dep_events = _events(core, namespace, name, "Deployment")
            rescaled = any(e.reason == "SuccessfulRescale" and "above target" in (e.message or "")
                           and _new_size(e.message) > 1 for e in pa_events)
            deployed = any(e.reason == "ScalingReplicaSet" and "Scaled up" in (e.message or "")
                           and _new_size(e.message) > 1 for e in dep_events)
            return custom.get_namespaced_custom_object("autoscaling.aibrix.ai", "v1alpha1", namespace,
                                                       "podautoscalers", name) if rescaled and deployed else None

        try:
            pa = wait_for("AIBrix's PodAutoscaler to scale the Deployment above 1 replica", scaled_up, 300, interval=2)
        except pytest.fail.Exception as e:
            # What AIBrix saw: its PodAutoscaler's status and the controller's own log tail.
            pa = custom.get_namespaced_custom_object("autoscaling.aibrix.ai", "v1alpha1", namespace,
                                                     "podautoscalers", name)
            tail = log_tail(cluster.logs_dir / f"{AIBRIX}.log", 40)
            pytest.fail(f"{e}\nrequests sent {traffic.sent}; PodAutoscaler status {pa.get('status')}\n{tail}",
                        pytrace=False)
        assert traffic.sent > 0
    st = pa["status"]
    conds = {c["type"]: c for c in st.get("conditions", [])}
    print(f"AIBrix: {st.get('actualScale')} -> {st.get('desiredScale')}, "
          f"conditions {[(c['type'], c['status'], c['reason']) for c in conds.values()]}, "
          f"history {st.get('scalingHistory')}")
    assert conds["AbleToScale"]["status"] == "True", conds
    events = _events(core, namespace, name, "PodAutoscaler")
    print("AIBrix events:", [(e.reason, e.message) for e in events])
    # "New size: N; reason: ..." from its reconcile, after an AlgorithmRun on the scraped metric.
    assert any(e.reason == "SuccessfulRescale" and "above target" in (e.message or "") for e in events), \
        [(e.reason, e.message) for e in events]
