"""The operator on the local cluster: real API server, real Prometheus, real pods, the operator as a
real process. Each test watches its own namespace with its own operator."""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

import pytest
import yaml
from ophelpers import SAMPLES, kubectl, lightweight_endpoint, ready_by_role, role, wait_for

pytestmark = [pytest.mark.cluster]


def _owned(obj) -> bool:
    refs = obj.metadata.owner_references or []
    return any(r.kind == "InferenceEndpoint" and r.controller for r in refs)


def test_tiny_cpu_sample_end_to_end(operator_factory, cluster_view, namespace, crd_installed):
    cv = cluster_view
    op = operator_factory("--interval", "3")
    kubectl(crd_installed, "apply", "-n", namespace, "-f", str(SAMPLES / "tiny-cpu.yaml"))
    name = "tiny-cpu"

    dep, svc, pdb = wait_for(lambda: (cv.apps.read_namespaced_deployment(name, namespace),
                                      cv.core.read_namespaced_service(name, namespace),
                                      cv.policy.read_namespaced_pod_disruption_budget(name, namespace)),
                             60, "Deployment, Service and PDB", op)
    assert _owned(dep) and _owned(svc) and _owned(pdb)
    assert "preheat.dev/role" not in dep.spec.selector.match_labels
    assert svc.spec.selector["preheat.dev/role"] == "serving"

    # Floor of 1 serving + warm pool of 1: two Ready pods, one of them promoted to serving.
    def settled():
        pods = cv.live_pods(name)
        serving, warm = ready_by_role(pods)
        return (serving, warm) if len(serving) == 1 and len(warm) == 1 else None

    serving, warm = wait_for(settled, 240, "1 serving + 1 warm Ready tiny-model pods", op)
    assert wait_for(lambda: cv.condition(name, "Ready").get("status") == "True", 60, "Ready=True", op)

    # The Service's EndpointSlice lists the serving pod and never the warm one.
    serving_ip, warm_ip = serving[0]["status"]["podIP"], warm[0]["status"]["podIP"]
    ips = wait_for(lambda: (lambda s: s if serving_ip in s else None)(cv.slice_ips(name)), 60,
                   "EndpointSlice with the serving pod", op)
    assert warm_ip not in ips
    assert ips == {serving_ip}

    # Both pods really serve the tiny model (the warm one is loaded, just outside the Service).
    for ip in (serving_ip, warm_ip):
        with urllib.request.urlopen(f"http://{ip}:8000/health/ready", timeout=5) as r:
            assert r.status == 200

    # The printer columns come from status, which the operator writes on its next loop step after the
    # pods settle: wait for that step rather than read a status from before it.
    def columns():
        out = kubectl(crd_installed, "get", "inferenceendpoints", "-n", namespace).stdout
        lines = out.splitlines()
        row = lines[1].split() if len(lines) > 1 else []
        return (lines[0].split(), row) if row[:3] == [name, "1", "1"] and row[6:7] == ["True"] else None

    header, row = wait_for(columns, 60, "printer columns: 1 serving, 1 warm, Ready", op)
    assert header == ["NAME", "SERVING", "WARM", "DESIRED", "SIGNAL", "FORECAST", "READY", "AGE"]
    assert row[0] == name and row[1] == "1" and row[2] == "1" and row[6] == "True"
    resources = kubectl(crd_installed, "api-resources", "--api-group=preheat.dev").stdout.splitlines()[1].split()
    assert resources[1].split(",") == ["ie", "iep"]

    status = cv.status(name)
    assert status["desiredReplicas"] == 2 and status["coldStartSeconds"] > 0
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "Scaling", "MetricsAvailable", "ForecastReady"}
    reasons = {e["reason"] for e in cv.events(name)}
    assert "Promoted" in reasons and "Reconciled" in reasons
    assert 'preheat_promotions_total{endpoint="tiny-cpu"' in op.metrics_text()

    # Deleting the endpoint deletes everything it owns (garbage collection through owner refs).
    kubectl(crd_installed, "delete", "-n", namespace, "inferenceendpoint", name, "--wait=true", timeout=120)

    def gone():
        from kubernetes.client.exceptions import ApiException

        for read in (cv.apps.read_namespaced_deployment, cv.core.read_namespaced_service,
                     cv.policy.read_namespaced_pod_disruption_budget):
            try:
                read(name, namespace)
                return False
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return not cv.pods(name)

    wait_for(gone, 120, "Deployment, Service, PDB and pods removed", op)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ("bad-min-gt-max.yaml", "scaling.minReplicas must be <= scaling.maxReplicas"),
        ("bad-negative-target.yaml", "scaling.targetPerReplica must be > 0"),
        ("bad-accelerator.yaml", 'supported values: "cpu", "gpu"'),
    ],
)
def test_bad_input_rejected_by_api_server(crd_installed, namespace, sample, message):
    proc = kubectl(crd_installed, "apply", "-n", namespace, "-f", str(SAMPLES / sample), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert "NotFound" in kubectl(crd_installed, "get", "-n", namespace, "ie",
                                 yaml.safe_load((SAMPLES / sample).read_text())["metadata"]["name"],
                                 check=False).stderr


def test_missing_model_path_is_not_ready_while_other_endpoint_serves(operator_factory, cluster_view, namespace,
                                                                     crd_installed):
    cv = cluster_view
    op = operator_factory("--interval", "3")
    kubectl(crd_installed, "apply", "-n", namespace, "-f", str(SAMPLES / "missing-model-path.yaml"))
    cv.create(lightweight_endpoint("healthy", minReplicas=1, warmPool={"min": 0, "max": 0}))

    failing = wait_for(lambda: (lambda c: c if c.get("status") == "False" and c.get("reason") == "ModelServerFailing"
                                else None)(cv.condition("missing-model-path", "Ready")),
                       180, "missing-model-path Ready=False/ModelServerFailing", op)
    assert "exit code" in failing["message"]
    # Kopf posts Events from a queue after the handler returns: the Event may trail the condition.
    warnings = wait_for(lambda: [e for e in cv.events("missing-model-path") if e["reason"] == "ModelServerFailing"],
                        30, "a ModelServerFailing Event", op)
    assert warnings[0]["type"] == "Warning"
    # Meanwhile the healthy endpoint reached Ready with its serving replica.
    wait_for(lambda: cv.condition("healthy", "Ready").get("status") == "True", 120, "healthy Ready=True", op)
    assert cv.status("missing-model-path").get("failingReplicas", 0) >= 1
    assert cv.status("missing-model-path").get("servingReplicas", 0) == 0


def test_operator_killed_mid_scale_up_converges_without_extra_pods(operator_factory, cluster_view, namespace,
                                                                   crd_installed):
    cv = cluster_view
    name = "scaleup"
    ep = lightweight_endpoint(name, minReplicas=1, maxReplicas=6, warmPool={"min": 1, "max": 1})
    ep["spec"]["server"]["extraArgs"] = ["--startup-delay-s", "3"]  # a cold start worth racing against
    op = operator_factory("--interval", "2")
    cv.create(ep)
    wait_for(lambda: cv.status(name).get("servingReplicas") == 1 and cv.status(name).get("warmReplicas") == 1,
             120, "1 serving + 1 warm", op)

    # Raise the serving floor through the scale subresource; kill the operator once it started acting.
    kubectl(crd_installed, "scale", "-n", namespace, f"ie/{name}", "--replicas=4")
    wait_for(lambda: (cv.apps.read_namespaced_deployment(name, namespace).spec.replicas or 0) > 2, 60,
             "the operator raised the Deployment's replicas", op, interval=0.2)
    op.kill()
    op2 = operator_factory("--interval", "2")

    def converged():
        st = cv.status(name)
        pods = cv.live_pods(name)
        serving, warm = ready_by_role(pods)
        dep = cv.apps.read_namespaced_deployment(name, namespace)
        ok = (len(serving) == 4 and len(warm) == 1 and dep.spec.replicas == 5 and len(pods) == 5
              and st.get("servingReplicas") == 4)
        return (st, pods) if ok else None

    st, pods = wait_for(converged, 180, "4 serving + 1 warm, replicas 5, 5 pods", op2)
    assert st["servingReplicas"] == 4 and st["desiredReplicas"] == 5
    # Every serving pod was promoted exactly once: no pod carries two promotions, none is left over.
    assert sum(role(p) == "serving" for p in pods) == 4
    assert cv.apps.read_namespaced_deployment(name, namespace).status.replicas == 5


def _load(ips_fn, stop: threading.Event, rate_per_s: float, limit: int) -> None:
    """Bounded load: POST completions to the serving pods' IPs (read from the EndpointSlice)."""
    sent = 0
    while not stop.is_set() and sent < limit:
        for ip in sorted(ips_fn()) or []:
            try:
                req = urllib.request.Request(f"http://{ip}:8000/v1/completions", data=b'{"prompt": "hi"}',
                                             headers={"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=2).read()
            except Exception:
                pass
            sent += 1
            break
        stop.wait(1.0 / rate_per_s)


def test_prometheus_down_holds_size_then_scaling_resumes(operator_factory, cluster_view, namespace, crd_installed):
    cluster = crd_installed.cluster
    if cluster is None and os.environ.get("PREHEAT_CLUSTER_STATE_DIR"):
        # A local cluster of its own state dir, given as an external one (PREHEAT_KUBECONFIG & co).
        from preheat_cluster import LocalCluster

        cluster = LocalCluster(state_dir=os.environ["PREHEAT_CLUSTER_STATE_DIR"])
    if cluster is None:
        pytest.fail("this test stops the local cluster's Prometheus; it cannot run against an external cluster "
                    "(set PREHEAT_CLUSTER_STATE_DIR for a local cluster in another state dir)")
    cv = cluster_view
    name = "promfault"
    op = operator_factory("--interval", "3")
    cv.create(lightweight_endpoint(name, minReplicas=1, maxReplicas=4, targetPerReplica=1,
                                   warmPool={"min": 0, "max": 1}))
    wait_for(lambda: cv.condition(name, "MetricsAvailable").get("status") == "True", 120,
             "MetricsAvailable=True", op)

    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(lambda: cv.slice_ips(name), stop, 6.0, 2000), daemon=True)
    loader.start()
    try:
        grown = wait_for(lambda: (lambda s: s if s.get("servingReplicas", 0) >= 3 else None)(cv.status(name)),
                         120, "scale-up under load (>= 3 serving)", op)
        cluster.stop_prometheus()
        stop.set()  # the load ends too: without metrics the operator must not notice and scale down
        unavailable = wait_for(lambda: (lambda c: c if c.get("status") == "False" else None)(
            cv.condition(name, "MetricsAvailable")), 60, "MetricsAvailable=False", op)
        assert unavailable["reason"] == "PrometheusUnreachable"
        held = cv.status(name)
        replicas = cv.apps.read_namespaced_deployment(name, namespace).spec.replicas
        assert held["desiredServingReplicas"] >= grown["servingReplicas"]
        # Several more decisions without metrics: the size stays.
        seen = set()
        wait_for(lambda: seen.add(cv.status(name).get("lastEvaluationTime")) or len(seen) >= 4, 90,
                 "three more loop steps while Prometheus is down", op, interval=1)
        # The decided size holds (a warm pod that finished loading may still be promoted into it).
        assert cv.status(name)["desiredServingReplicas"] == held["desiredServingReplicas"]
        assert cv.status(name)["servingReplicas"] >= held["servingReplicas"]
        assert cv.apps.read_namespaced_deployment(name, namespace).spec.replicas == replicas
        assert "preheat_endpoint_metrics_available" in op.metrics_text()
    finally:
        stop.set()
        cluster.start_prometheus(wait=True)
    wait_for(lambda: cv.condition(name, "MetricsAvailable").get("status") == "True", 120,
             "MetricsAvailable=True again", op)
    # Scaling resumes: the load is gone, so the endpoint comes back down to its floor.
    wait_for(lambda: cv.status(name).get("servingReplicas") == 1, 180, "scale back down to 1 serving", op)


def test_preview_mode_reports_but_leaves_replicas_alone(operator_factory, cluster_view, namespace, crd_installed):
    cv = cluster_view
    name = "preview"
    op = operator_factory("--interval", "2")
    ep = lightweight_endpoint(name, mode="Preview", minReplicas=1, maxReplicas=3, warmPool={"min": 1, "max": 1})
    cv.create(ep)
    wait_for(lambda: cv.status(name).get("servingReplicas") == 2, 120, "every Ready pod serving in Preview", op)
    # Someone else (today's autoscaler) owns replicas: Preheat must not undo a manual scale.
    cv.apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 3}})
    wait_for(lambda: cv.status(name).get("servingReplicas") == 3, 120, "the third pod serving too", op)
    wait_for(lambda: any(e["reason"] == "PreviewDecision" for e in cv.events(name)), 60, "a PreviewDecision Event", op)
    assert cv.apps.read_namespaced_deployment(name, namespace).spec.replicas == 3
    scaling = cv.condition(name, "Scaling")
    assert scaling["status"] == "False" and scaling["reason"] == "PreviewMode"
    assert cv.status(name)["lastDecision"]["applied"] is False


def _with_api_key(name: str, server: dict) -> dict:
    body = yaml.safe_load((SAMPLES / "tiny-cpu.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["server"].update(server)
    body["spec"]["scaling"].update(warmPool={"min": 0, "max": 0}, maxReplicas=1)
    return body


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"apiKeySecret": {"name": "Chat_Key", "key": "token"}}, "server.apiKeySecret.name must be a Secret name"),
        ({"apiKeySecret": {"name": "chat-key", "key": "a/b"}}, "server.apiKeySecret.key must be a Secret key"),
        ({"apiKeySecret": {"name": "chat-key", "key": "token"}, "env": {"PREHEAT_API_KEY": "x"}},
         "server.env sets PREHEAT_API_KEY and server.apiKeySecret sets it too"),
    ],
)
def test_bad_api_key_secret_rejected_by_api_server(cluster_view, namespace, crd_installed, server, message):
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as err:
        cluster_view.create(_with_api_key("bad-key", server))
    assert err.value.status == 422 and message in err.value.body, err.value.body


def test_api_key_from_a_secret_guards_the_api_but_not_probes_or_metrics(operator_factory, cluster_view, namespace,
                                                                       crd_installed):
    cv = cluster_view
    key = "k19-" + os.urandom(8).hex()
    cv.core.create_namespaced_secret(namespace, {"metadata": {"name": "chat-key"}, "stringData": {"token": key}})
    op = operator_factory("--interval", "3")
    name = "keyed"
    cv.create(_with_api_key(name, {"apiKeySecret": {"name": "chat-key", "key": "token"}}))

    # The readiness probe carries no key: the pod becomes Ready only because /health/ready stays open.
    def ready_pod():
        serving, _ = ready_by_role(cv.live_pods(name))
        return serving[0] if serving else None

    pod = wait_for(ready_pod, 240, "a Ready serving pod of the keyed endpoint", op)
    base = f"http://{pod['status']['podIP']}:8000"

    def get(path: str, token: str | None = None) -> int:
        req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert get("/v1/models") == 401
    assert get("/v1/models", "wrong") == 401
    assert get("/v1/models", key) == 200
    assert get("/metrics") == 200 and get("/health/live") == 200
