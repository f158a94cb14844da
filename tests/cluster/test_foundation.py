"""The local cluster's Must-show behaviours, on the real components: Deployments of processes with
pod IPs, EndpointSlices and scaling (PIDs checked), graceful deletion, CRD schema + CEL rejection,
RBAC from inside a pod, Prometheus scraping pods, and `down` leaving no process behind."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
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


def pid_of(pod: client.V1Pod, container: int = 0) -> int:
    cid = pod.status.container_statuses[container].container_id
    assert cid and cid.startswith("preheat://"), cid
    return int(cid.removeprefix("preheat://"))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def proc_env(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)


def namespace_pids(namespace: str) -> list[int]:
    """Every live process started for a pod of `namespace` (found by the pod dir in its env)."""
    marker = f"/pods/{namespace}/"
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            try:
                if marker in proc_env(int(entry)).get("PREHEAT_POD_DIR", "") + "/":
                    out.append(int(entry))
            except OSError:
                continue
    return out


def ready(pod: client.V1Pod) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def ready_pods(core: client.CoreV1Api, ns: str, selector: str, n: int) -> list[client.V1Pod] | None:
    pods = [p for p in core.list_namespaced_pod(ns, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]
    return pods if len(pods) == n and all(ready(p) for p in pods) else None


def pod_phase(core: client.CoreV1Api, ns: str, name: str, phases: tuple[str, ...]) -> client.V1Pod | None:
    p = core.read_namespaced_pod(name, ns)
    return p if p.status.phase in phases else None


def python_pod(name: str, script: str, **spec: Any) -> dict:
    """A pod of the generic python:3.11-slim image running `script` with the host's Python."""
    container = {"name": "main", "image": "python:3.11-slim", "command": ["python", "-c", textwrap.dedent(script)]}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


@pytest.fixture
def core(kube_api) -> client.CoreV1Api:
    return client.CoreV1Api(kube_api)


# ----- Deployment of http.server, EndpointSlice, scaling with PID checks ---------------------------
def test_http_server_deployment_scales_with_processes_and_endpointslice(core, kube_api, namespace,
                                                                       local_cluster) -> None:
    apps = client.AppsV1Api(kube_api)
    disc = client.DiscoveryV1Api(kube_api)
    labels = {"app": "web"}
    core.create_namespaced_service(namespace, {
        "metadata": {"name": "web"}, "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}})
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [{
                "name": "http", "image": "python:3.11-slim",
                "command": ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
            }]}}}})
    pods = wait_for("2 ready http.server pods", lambda: ready_pods(core, namespace, "app=web", 2), 90)
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 2
    if local_cluster.cluster is not None:
        net = ipaddress.ip_network(local_cluster.cluster.pod_cidr)
        assert all(ipaddress.ip_address(ip) in net for ip in ips)
    for p in pods:
        code, body = http_get(f"http://{p.status.pod_ip}:8080/")
        assert code == 200 and "Directory listing" in body
        pid = pid_of(p)
        assert alive(pid) and proc_env(pid)["POD_IP"] == p.status.pod_ip

    def slice_ips() -> set[str] | None:
        slices = disc.list_namespaced_endpoint_slice(namespace, label_selector="kubernetes.io/service-name=web").items
        got = {a for s in slices for e in s.endpoints or [] if e.conditions.ready for a in e.addresses}
        return got if got == ips else None

    wait_for("the Service's EndpointSlice to list both pods", slice_ips, 60)

    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 4}})
    pods4 = wait_for("4 ready pods", lambda: ready_pods(core, namespace, "app=web", 4), 90)
    pids4 = {pid_of(p) for p in pods4}
    assert len({p.status.pod_ip for p in pods4}) == 4 and len(pids4) == 4
    assert all(alive(pid) for pid in pids4)
    assert sorted(namespace_pids(namespace)) == sorted(pids4)

    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 1}})
    pods1 = wait_for("1 ready pod left", lambda: ready_pods(core, namespace, "app=web", 1), 90)
    kept = pid_of(pods1[0])
    wait_for("the 3 removed pods' processes to exit",
             lambda: not any(alive(p) for p in pids4 - {kept}), 60)
    assert alive(kept)
    # None orphaned: the only process left for this namespace is the remaining pod's.
    wait_for("only the kept process to remain", lambda: namespace_pids(namespace) == [kept], 30)
    wait_for("the EndpointSlice to shrink to the kept pod",
             lambda: (lambda s: s == {pods1[0].status.pod_ip})(
                 {a for s in disc.list_namespaced_endpoint_slice(
                     namespace, label_selector="kubernetes.io/service-name=web").items
                  for e in s.endpoints or [] if e.conditions.ready for a in e.addresses}), 60)


# ----- graceful deletion ----------------------------------------------------------------------------
GRACEFUL = """
import signal, sys, time
def on_term(*_):
    print("got SIGTERM, finishing the request in flight", flush=True)
    time.sleep(1.5)
    print("finished cleanly", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("serving", flush=True)
while True:
    time.sleep(0.1)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
print("serving", flush=True)
while True:
    time.sleep(0.1)
"""


def test_graceful_deletion_sends_sigterm_then_sigkill_after_the_grace(core, namespace, local_cluster) -> None:
    core.create_namespaced_pod(namespace, python_pod("graceful", GRACEFUL, terminationGracePeriodSeconds=30))
    core.create_namespaced_pod(namespace, python_pod("stubborn", STUBBORN, terminationGracePeriodSeconds=30))
    pods = {n: wait_for(f"{n} running", lambda n=n: pod_phase(core, namespace, n, ("Running",)), 60)
            for n in ("graceful", "stubborn")}
    pids = {n: pid_of(p) for n, p in pods.items()}
    logs = {n: local_cluster.pod_log_path(namespace, n) for n in pods}
    wait_for("both to print 'serving'", lambda: all("serving" in logs[n].read_text() for n in logs), 30)
    core.delete_namespaced_pod("graceful", namespace, grace_period_seconds=5)
    core.delete_namespaced_pod("stubborn", namespace, grace_period_seconds=2)

    def gone(name: str) -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
            return False
        except ApiException as e:
            return e.status == 404

    wait_for("both pod objects to be finalised", lambda: gone("graceful") and gone("stubborn"), 60)
    assert not alive(pids["graceful"]) and not alive(pids["stubborn"])
    text = logs["graceful"].read_text()
    # It got SIGTERM (not SIGKILL) and had the time to finish what it was doing.
    assert "got SIGTERM" in text and "finished cleanly" in text
    # The one that ignores SIGTERM was SIGKILLed once its 2 s grace ran out.
    assert "ignoring SIGTERM" in logs["stubborn"].read_text()


# ----- CRD with openAPIV3Schema and CEL -----------------------------------------------------------
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


# ----- RBAC from inside a pod -------------------------------------------------------------------
LIST_PODS = """
import base64, json, os, sys
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config.incluster_config import InClusterConfigLoader
sa = os.environ["PREHEAT_SERVICEACCOUNT_DIR"]
InClusterConfigLoader(token_filename=sa + "/token", cert_filename=sa + "/ca.crt").load_and_set()
token = open(sa + "/token").read()
claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
print("TOKEN", claims["sub"], claims["kubernetes.io"]["pod"]["name"], flush=True)
ns = open(sa + "/namespace").read()
try:
    n = len(client.CoreV1Api().list_namespaced_pod(ns).items)
    print("STATUS 200 pods", n, flush=True)
except ApiException as e:
    print("STATUS", e.status, flush=True)
"""


def test_rbac_applies_to_a_process_in_a_pod(core, kube_api, namespace, local_cluster) -> None:
    rbac = client.RbacAuthorizationV1Api(kube_api)
    for sa in ("reader", "nobody"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "pod-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "reader"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                    "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    for sa in ("reader", "nobody"):
        core.create_namespaced_pod(namespace, python_pod(f"as-{sa}", LIST_PODS, serviceAccountName=sa))
    for sa, want in (("reader", "STATUS 200"), ("nobody", "STATUS 403")):
        pod = wait_for(f"pod as-{sa} to finish",
                       lambda sa=sa: pod_phase(core, namespace, f"as-{sa}", ("Succeeded", "Failed")), 90)
        log = local_cluster.pod_log_path(namespace, f"as-{sa}").read_text()
        assert pod.status.phase == "Succeeded", log
        assert want in log, log
        # The token is the pod's own: issued for its service account and bound to this pod.
        assert f"TOKEN system:serviceaccount:{namespace}:{sa} as-{sa}" in log


# ----- env, downward API, configMap/secret volumes ------------------------------------------------
SHOW_ENV = """
import os, pathlib
for k in ("MY_NAME", "MY_NS", "MY_IP", "MY_ROLE", "FROM_CM", "FROM_SECRET", "CFG_greeting", "JOINED", "LIMIT_CPU"):
    print(f"{k}={os.environ.get(k)}")
cfg = os.environ["PREHEAT_MOUNT_ETC_DEMO"]
print("FILE=" + pathlib.Path(cfg, "greeting").read_text())
print("SECRET_FILE=" + pathlib.Path(os.environ["PREHEAT_MOUNT_ETC_CREDS"], "password").read_text())
print("ARG=" + os.environ["ARG_PATH"])
print("CWD=" + os.getcwd())
"""


def test_env_downward_api_and_volumes_reach_the_process(core, namespace, local_cluster) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "demo"}, "data": {"greeting": "hello"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}})
    pod = python_pod("env", SHOW_ENV, volumes=[
        {"name": "cfg", "configMap": {"name": "demo"}}, {"name": "sec", "secret": {"secretName": "creds"}},
        {"name": "scratch", "emptyDir": {}}], container={
        "workingDir": "/scratch",
        "envFrom": [{"configMapRef": {"name": "demo"}, "prefix": "CFG_"}],
        "env": [
            {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MY_ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "demo", "key": "greeting"}}},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "JOINED", "value": "$(MY_NAME)@$(MY_IP)"},
            {"name": "LIMIT_CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "ARG_PATH", "value": "/etc/demo/greeting"},
        ],
        "resources": {"limits": {"cpu": "1500m"}},
        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/demo"}, {"name": "sec", "mountPath": "/etc/creds"},
                         {"name": "scratch", "mountPath": "/scratch"}]})
    pod["metadata"]["labels"] = {"role": "warm"}
    core.create_namespaced_pod(namespace, pod)
    p = wait_for("the pod to finish", lambda: pod_phase(core, namespace, "env", ("Succeeded", "Failed")), 60)
    out = local_cluster.pod_log_path(namespace, "env").read_text()
    assert p.status.phase == "Succeeded", out
    ip = p.status.pod_ip
    for line in ("MY_NAME=env", f"MY_NS={namespace}", f"MY_IP={ip}", "MY_ROLE=warm", "FROM_CM=hello",
                 "FROM_SECRET=s3cret", "CFG_greeting=hello", f"JOINED=env@{ip}", "LIMIT_CPU=2",
                 "FILE=hello", "SECRET_FILE=s3cret"):
        assert line in out.splitlines(), (line, out)
    # Paths under a mount point are rewritten into the pod's directory, in env values and workingDir.
    pod_dir = Path(local_cluster.pod_log_path(namespace, "env")).parents[1]
    assert f"ARG={pod_dir}/volumes/cfg/greeting" in out
    assert f"CWD={pod_dir}/volumes/scratch" in out


# ----- restarts, probes, unmapped images ----------------------------------------------------------
def test_crashing_container_restarts_with_back_off_and_exit_code(core, namespace) -> None:
    core.create_namespaced_pod(namespace, python_pod("crash", "import sys; print('boom'); sys.exit(3)",
                                                     restartPolicy="Always"))

    def crashlooping() -> client.V1ContainerStatus | None:
        st = (core.read_namespaced_pod("crash", namespace).status.container_statuses or [None])[0]
        if st and st.restart_count >= 1 and st.state.waiting and st.state.waiting.reason == "CrashLoopBackOff":
            return st
        return None

    st = wait_for("CrashLoopBackOff", crashlooping, 60)
    assert st.last_state.terminated.exit_code == 3 and st.last_state.terminated.reason == "Error"
    assert not st.ready


def test_failing_liveness_probe_restarts_the_container(core, namespace) -> None:
    pod = python_pod("live", "", restartPolicy="Always", container={
        "command": ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
        "livenessProbe": {"httpGet": {"path": "/no-such-file", "port": 8080}, "periodSeconds": 1,
                          "failureThreshold": 2}})
    core.create_namespaced_pod(namespace, pod)
    st = wait_for("a liveness restart", lambda: (lambda s: s if s and s.restart_count >= 1 else None)(
        (core.read_namespaced_pod("live", namespace).status.container_statuses or [None])[0]), 60)
    assert st.last_state.terminated is not None
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=live").items
    assert any(e.reason == "Unhealthy" and "Liveness probe failed" in e.message for e in events)


def test_unmapped_image_waits_with_reason_and_event(core, namespace) -> None:
    core.create_namespaced_pod(namespace, {"metadata": {"name": "nomap"}, "spec": {
        "containers": [{"name": "c", "image": "nginx:1.27"}]}})
    st = wait_for("ImageNotMapped", lambda: (lambda s: s if s and s.state.waiting and
                                             s.state.waiting.reason == "ImageNotMapped" else None)(
        (core.read_namespaced_pod("nomap", namespace).status.container_statuses or [None])[0]), 60)
    assert "nginx:1.27" in st.state.waiting.message
    events = wait_for("the ImageNotMapped event", lambda: [
        e for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=nomap").items
        if e.reason == "ImageNotMapped"], 30)
    assert events[0].type == "Warning"


# ----- Prometheus -----------------------------------------------------------------------------------
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
