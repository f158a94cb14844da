"""Scale to zero on the local cluster: the activator (`preheat activator` from the operator's image) takes
the Service at zero pods, holds a request sent there, the operator reads its counter from the real
Prometheus and wakes the endpoint, the request is answered by the new replica, and the Service goes
back to the serving pods. Then scale to zero is turned off (the activator parked at zero pods, the
Service on the serving pods) and on again (the activator back, the endpoint at zero again)."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from ophelpers import dump, is_ready, kubectl, lightweight_endpoint, ready_by_role, wait_for
from preheat.controller import builders, routing

pytestmark = [pytest.mark.cluster]


def _activator_ip(cv, name: str) -> str | None:
    sel = builders.selector_string(routing.activator_selector(name))
    for p in cv.core.list_namespaced_pod(cv.ns, label_selector=sel).items:
        pod = cv.api.sanitize_for_serialization(p)
        if is_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            return pod["status"]["podIP"]
    return None


# Run in a client pod: a request by the Service's DNS name, through CoreDNS and kube-proxy, as an app sends it.
POST = ("import json, sys, urllib.request; r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], "
        "data=b'{\"prompt\": \"hi\", \"max_tokens\": 1}', headers={'Content-Type': 'application/json'}), "
        "timeout=300); print(r.status); print(r.read().decode())")


def _client_pod(cv) -> None:
    sc = {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
          "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    cv.core.create_namespaced_pod(cv.ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
            "name": "c", "image": "preheat/operator:dev", "imagePullPolicy": "Never", "command": ["python3", "-c",
            "import time; time.sleep(3600)"], "securityContext": sc,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}}]}})


GET = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"


def _through_service(handle, ns: str, url: str) -> bool:
    """The activator answers /healthz itself: through the Service, that says kube-proxy sends to it."""
    p = kubectl(handle, "exec", "-n", ns, "client", "--", "python3", "-c", GET, url, check=False, timeout=30)
    return p.returncode == 0 and p.stdout.strip() == "ok"


def _send(handle, ns: str, url: str, out: dict) -> None:
    p = kubectl(handle, "exec", "-n", ns, "client", "--", "python3", "-c", POST, url, check=False, timeout=320)
    out["rc"], out["stdout"], out["stderr"] = p.returncode, p.stdout, p.stderr[-2000:]


def _metric(ip: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{ip}:{routing.ACTIVATOR_PORT}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_a_request_at_zero_is_held_by_the_activator_and_wakes_the_endpoint(operator_factory, cluster_view,
                                                                           namespace, crd_installed):
    cv = cluster_view
    name = "sleepy"
    op = operator_factory("--interval", "3", "--activator-image", "preheat/operator:dev")
    _client_pod(cv)
    cv.create(lightweight_endpoint(name, minReplicas=0, scaleToZero=True, scaleToZeroGraceSeconds=5,
                                   warmPool={"min": 0, "max": 0}))

    # One replica while the grace runs, then zero: no model-server pod, the public Service on the activator.
    act_ip = wait_for(lambda: _activator_ip(cv, name), 180, "a Ready activator pod", op)
    wait_for(lambda: cv.apps.read_namespaced_deployment(name, namespace).spec.replicas == 0 and not cv.live_pods(name),
             180, "scaled to zero after the grace", op)
    assert wait_for(lambda: cv.slice_ips(name) == {act_ip}, 60, "the Service's EndpointSlice lists the activator", op)
    assert cv.core.read_namespaced_service(f"{name}-serving", namespace).spec.selector["preheat.dev/role"] == "serving"

    # A request to the Service from a pod is held until a replica serves, then answered by it.
    wait_for(lambda: cv.core.read_namespaced_pod("client", namespace).status.phase == "Running", 120, "client pod", op)
    base = f"http://{name}.{namespace}.svc:8000"
    wait_for(lambda: _through_service(crd_installed, namespace, f"{base}/healthz"), 60,
             "the Service's ClusterIP answered by the activator", op)
    out: dict = {}
    url = f"{base}/v1/completions"
    sender = threading.Thread(target=_send, args=(crd_installed, namespace, url, out))
    sender.start()
    wait_for(lambda: _metric(act_ip, "preheat:activator_requests_waiting") == 1 or out, 60, "the request held", op, 0.2)
    assert not out, dump(out)  # still held: no serving replica yet
    sender.join(timeout=330)
    assert out.get("rc") == 0 and out["stdout"].startswith("200"), dump(out)
    assert json.loads(out["stdout"].split("\n", 1)[1])["object"] == "text_completion"

    # The operator woke the endpoint on the activator's count (no forecast, no pod to scrape before).
    pods = cv.live_pods(name)
    serving, _ = ready_by_role(pods)
    assert len(serving) == 1, dump(pods)
    assert wait_for(lambda: cv.slice_ips(name) == {serving[0]["status"]["podIP"]}, 60,
                    "the Service back on the serving pod", op)
    routed = [e["message"] for e in cv.events(name) if e["reason"] == "Routed"]
    assert any("serving pods" in m for m in routed), routed
    assert _metric(act_ip, "preheat:activator_requests_total") == 1
    assert _metric(act_ip, "preheat:activator_hold_seconds_count") == 1

    # Scale to zero off: the activator is parked at zero pods (nothing deleted), the Service keeps the serving pods.
    cv.patch_scaling(name, scaleToZero=False, minReplicas=1)
    wait_for(lambda: cv.apps.read_namespaced_deployment(routing.activator_name(name), namespace).spec.replicas == 0,
             120, "the activator parked at zero pods", op)
    wait_for(lambda: _activator_ip(cv, name) is None, 120, "no activator pod left", op)
    assert cv.core.read_namespaced_service(name, namespace).spec.selector == builders.serving_selector(name)
    assert cv.apps.read_namespaced_deployment(name, namespace).spec.replicas >= 1

    # On again: the parked activator comes back to one Ready pod and the endpoint goes to zero behind it.
    cv.patch_scaling(name, scaleToZero=True, minReplicas=0)
    act_ip = wait_for(lambda: _activator_ip(cv, name), 180, "the activator Ready again", op)
    wait_for(lambda: cv.apps.read_namespaced_deployment(name, namespace).spec.replicas == 0 and not cv.live_pods(name),
             180, "zero again after the grace", op)
    assert wait_for(lambda: cv.slice_ips(name) == {act_ip}, 60, "the Service on the activator again", op)
