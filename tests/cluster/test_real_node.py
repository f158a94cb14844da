"""The local cluster's real nodes: two kubelets with their own containerd, runc and bridge CNI,
kube-proxy and CoreDNS, running pods from the images `make images` built from the Dockerfiles.

The tests use the session's shared cluster (tests/conftest.py). The node-loss test stops a node's kubelet
and containerd, then brings the node back for the tests after it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cluster

OPERATOR_IMAGE = "preheat/operator:dev"
MODEL_SERVER_IMAGE = "preheat/model-server:dev"
# A word match, as in tests/ship/test_install.py: a random port (Prometheus at :24031) holds "403" by chance.
PERMISSION_ERROR = re.compile(r"\b403\b|forbidden", re.IGNORECASE)
RESTRICTED = {
    "runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# A CPU model-server replica's size for the warm-pool test: 1 core (a node here has 2) and the memory the
# loaded server keeps while warm: preheat-server --model smollm2-135m was 3.73 GiB RSS once Ready on this
# machine (tiny: 0.77 GiB), rounded up. Warm: 100m, the same memory (the weights stay loaded).
SERVING_SIZE = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "1", "memory": "4Gi"}}
WARM_SIZE = {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}
# Reads, from inside the container, what the kernel applies to it (cgroups v1 and v2 layouts).
PROBE = r"""
import json, os
def read(*paths):
    for p in paths:
        try:
            return open(p).read().split()
        except OSError:
            pass
    return None
print(json.dumps({
    "ns": {n: os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "mnt", "net", "uts", "ipc")},
    "pid": os.getpid(),
    "cpu_quota": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max"),
    "cpu_period": read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    "memory_limit": read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
}))
"""


@pytest.fixture(scope="module")
def real(local_cluster):
    """The session's cluster: its two real nodes (external clusters are not ours to stop a node of)."""
    cluster = local_cluster.cluster
    if cluster is None:
        pytest.fail("these tests drive the local cluster's own real nodes (PREHEAT_KUBECONFIG points elsewhere)",
                    pytrace=False)
    return cluster


def kc(cluster, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
                       capture_output=True, text=True, input=input, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r


def apply(cluster, *docs: dict) -> None:
    kc(cluster, "apply", "-f", "-", input=yaml.safe_dump_all(docs))


def wait(what: str, check, timeout: float = 120.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def get(cluster, kind: str, name: str, ns: str) -> dict:
    return json.loads(kc(cluster, "get", kind, name, "-n", ns, "-o", "json").stdout)


def wait_ready(cluster, pod_name: str, ns: str, timeout: float) -> dict:
    """The pod once Ready; on a timeout the failure says why (its status, events and log tail)."""
    try:
        return wait(f"pod {pod_name} Ready", lambda: running(cluster, pod_name, ns), timeout=timeout)
    except AssertionError as e:
        describe = kc(cluster, "describe", "pod", pod_name, "-n", ns, check=False).stdout[-3000:]
        logs = kc(cluster, "logs", pod_name, "-n", ns, "--tail=30", check=False)
        raise AssertionError(f"{e}\n{describe}\n--- log ---\n{logs.stdout}{logs.stderr}") from None


def running(cluster, pod: str, ns: str) -> dict | None:
    p = json.loads(kc(cluster, "get", "pod", pod, "-n", ns, "-o", "json", check=False).stdout or "{}")
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
    return p if ready else None


@pytest.fixture
def ns(real) -> Iterator[str]:
    name = f"rn-{uuid.uuid4().hex[:8]}"
    apply(real, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait("the default ServiceAccount", lambda: kc(real, "get", "sa", "default", "-n", name, check=False).returncode == 0)
    yield name
    kc(real, "delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, image: str, command: list[str], *, node: str | None = None, cpu: str = "500m",
        memory: str = "256Mi", labels: dict | None = None, port: int | None = None) -> dict:
    c = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
         "securityContext": RESTRICTED, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
         "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}}
    if port:
        c["ports"] = [{"containerPort": port}]
        c["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    spec = {"containers": [c], "volumes": [{"name": "tmp", "emptyDir": {}}], "terminationGracePeriodSeconds": 1}
    if node:
        # Through the scheduler (not nodeName), so a pod waits for room instead of failing admission.
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def probe(cluster, name: str, ns: str) -> dict:
    out = kc(cluster, "exec", "-n", ns, name, "--", "python3", "-c", PROBE).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_two_ready_nodes_run_kubelet_and_containerd(real) -> None:
    from preheat_cluster.launcher import pinned_versions

    nodes = json.loads(kc(real, "get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == 2
    for n in nodes:
        info = n["status"]["nodeInfo"]
        assert info["kubeletVersion"] == pinned_versions()["KUBERNETES_VERSION"]
        assert info["containerRuntimeVersion"] == "containerd://" + pinned_versions()["CONTAINERD_VERSION"].lstrip("v")
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    wide = kc(real, "get", "nodes", "-o", "wide").stdout
    print("\n" + wide)
    assert len({n["spec"].get("podCIDR") or n["metadata"]["name"] for n in nodes}) == 2


def test_pod_runs_in_its_own_namespaces_with_its_cpu_quota_and_memory_limit(real, ns: str) -> None:
    apply(real, {**pod("probe", OPERATOR_IMAGE, ["python3", "-c", "import time; time.sleep(3600)"],
                       cpu="500m", memory="192Mi"), "metadata": {"name": "probe", "namespace": ns}})
    wait("the probe pod Ready", lambda: running(real, "probe", ns))
    inside = probe(real, "probe", ns)
    for kind, link in inside["ns"].items():
        assert link != os.readlink(f"/proc/self/ns/{kind}"), f"{kind} namespace shared with the host"
    assert inside["cpu_quota"] == ["50000"] and inside["cpu_period"] == ["100000"]
    assert inside["memory_limit"] == [str(192 * 2**20)]


@pytest.fixture(scope="module")
def model_server_image(real) -> str:
    """The CPU model-server image from model-server/Dockerfile, imported into both nodes at start."""
    return MODEL_SERVER_IMAGE


def test_model_server_pod_has_its_limits(real, ns: str, model_server_image: str) -> None:
    server = pod("server", model_server_image, ["preheat-server", "--model", "tiny", "--port", "8000"],
                 cpu="1", memory="1Gi", port=8000)
    server["metadata"]["namespace"] = ns
    # It binds $POD_IP, as the operator's pods do.
    server["spec"]["containers"][0]["env"] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    apply(real, server)
    wait_ready(real, "server", ns, timeout=300)
    inside = probe(real, "server", ns)
    assert inside["cpu_quota"] == ["100000"]
    assert inside["memory_limit"] == [str(2**30)]
    assert inside["ns"]["net"] != os.readlink("/proc/self/ns/net")


def test_service_clusterip_and_dns_name_reach_a_pod_on_the_other_node(real, ns: str) -> None:
    server = pod("web", OPERATOR_IMAGE, ["python3", "-m", "http.server", "8080", "--directory", "/opt"],
                 node="preheat-node-1", labels={"app": "web"}, port=8080, cpu="100m", memory="64Mi")
    server["metadata"]["namespace"] = ns
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
           "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    client = pod("client", OPERATOR_IMAGE, ["python3", "-c", "import time; time.sleep(3600)"], node="preheat-node-2",
                 cpu="100m", memory="64Mi")
    client["metadata"]["namespace"] = ns
    apply(real, server, svc, client)
    wait("server and client Ready", lambda: running(real, "web", ns) and running(real, "client", ns))
    ip = get(real, "service", "web", ns)["spec"]["clusterIP"]
    fetch = ("import sys, urllib.request; "
             "print(urllib.request.urlopen(sys.argv[1], timeout=5).status)")
    for url in (f"http://{ip}/", f"http://web.{ns}.svc.cluster.local/", "http://web/"):
        r = wait(f"GET {url} from the client pod", lambda u=url: (lambda p: p.returncode == 0 and p)(
            kc(real, "exec", "-n", ns, "client", "--", "python3", "-c", fetch, u, check=False)), timeout=60, every=1)
        assert r.stdout.strip() == "200", (url, r.stdout, r.stderr)


def test_restricted_namespace_rejects_a_privileged_pod_and_admits_preheats(real) -> None:
    name = f"preheat-rn-{uuid.uuid4().hex[:6]}"
    apply(real, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    try:
        wait("the default ServiceAccount", lambda: kc(real, "get", "sa", "default", "-n", name, check=False).returncode == 0)
        bad = pod("bad", OPERATOR_IMAGE, ["python3", "-c", "pass"])
        bad["metadata"]["namespace"] = name
        bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        r = kc(real, "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
        assert r.returncode != 0 and "violates PodSecurity" in r.stderr and "privileged" in r.stderr, r.stderr
        good = pod("operator", OPERATOR_IMAGE, ["preheat", "operator", "--help"])
        good["metadata"]["namespace"] = name
        good["spec"]["restartPolicy"] = "Never"
        apply(real, good)
        done = wait("the operator pod to finish", lambda: (lambda p: p if p["status"].get("phase") in ("Succeeded", "Failed") else None)(
            get(real, "pod", "operator", name)))
        assert done["status"]["phase"] == "Succeeded", done["status"]
    finally:
        kc(real, "delete", "namespace", name, "--wait=false", check=False)


def test_in_place_resize_changes_the_cpu_quota_without_a_restart(real, ns: str) -> None:
    p = pod("warm", OPERATOR_IMAGE, ["python3", "-c", "import time; time.sleep(3600)"], cpu="250m", memory="128Mi")
    p["metadata"]["namespace"] = ns
    apply(real, p)
    before = wait("the pod Ready", lambda: running(real, "warm", ns))
    assert probe(real, "warm", ns)["cpu_quota"] == ["25000"]
    cid = before["status"]["containerStatuses"][0]["containerID"]
    t0 = time.monotonic()
    patch = {"spec": {"containers": [{"name": "main", "resources": {
        "requests": {"cpu": "1", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}}}]}}
    kc(real, "patch", "pod", "warm", "-n", ns, "--subresource=resize", "--type=strategic", "-p", json.dumps(patch))
    wait("the resize to reach the container", lambda: probe(real, "warm", ns)["cpu_quota"] == ["100000"], timeout=60)
    took = time.monotonic() - t0
    after = get(real, "pod", "warm", ns)
    status = after["status"]["containerStatuses"][0]
    assert status["containerID"] == cid and status["restartCount"] == 0
    assert status["resources"]["limits"]["cpu"] == "1"
    print(f"\nin-place resize 250m -> 1 CPU reached the cgroup in {took:.2f}s")


# Polls, inside the container, its own CPU quota every 10 ms and prints the wall time it changed.
WATCH_QUOTA = r"""
import sys, time
def cores():
    for q, p in (("/sys/fs/cgroup/cpu.max", None), ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            parts = open(q).read().split() + ([open(p).read().strip()] if p else [])
            return int(parts[0]) / int(parts[1])
        except (OSError, ValueError):
            pass
first = cores()
print("watching", first, flush=True)
deadline = time.time() + float(sys.argv[1])
while cores() == first and time.time() < deadline:
    time.sleep(0.01)
print(time.time(), cores(), flush=True)
"""
# GETs a URL every 20 ms (0.5 s timeout) and prints the wall time of the first 200.
WATCH_SERVICE = r"""
import sys, time, urllib.request
print("watching", flush=True)
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    try:
        if urllib.request.urlopen(sys.argv[1], timeout=0.5).status == 200:
            print(time.time(), flush=True)
            break
    except OSError:
        time.sleep(0.02)
"""


def cgroup_size(cluster, pod_name: str, ns: str) -> dict:
    """The CPU cores and memory bytes the kernel gives a container now (cgroup v1 or v2)."""
    inside = probe(cluster, pod_name, ns)
    quota = inside["cpu_quota"]
    cores = int(quota[0]) / int(quota[1] if len(quota) == 2 else inside["cpu_period"][0])
    return {"cpu": cores, "memory": int(inside["memory_limit"][0])}


def watcher(cluster, ns: str, pod_name: str, script: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "exec", "-n", ns,
                          pod_name, "--", "python3", "-c", script, *args], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().startswith("watching"), f"watcher in {pod_name} did not start"
    return p


def watched_time(p: subprocess.Popen) -> float:
    out, _ = p.communicate(timeout=90)
    assert out.strip(), "the watcher saw no change"
    return float(out.split()[0])


def test_operator_resizes_a_warm_pod_in_place_and_promotes_it(real, ns: str, monkeypatch) -> None:
    """The operator's own plan and scale code (scaling.warmPool.resources) against real kubelets: a Ready
    pod shrinks to the warm size in place, and a promotion resizes it back and relabels it into the
    Service, with no restart (same container, restartCount 0) and the kernel's CPU quota following."""
    from kubernetes import client, config
    from preheat.controller import actuation, kube, scale, warm_size
    from preheat.controller.builders import (
        CONTAINER,
        LABEL_ROLE,
        pod_sizes,
        pod_template,
        selector_labels,
        selector_string,
        serving_selector,
    )
    from preheat.controller.spec import parse_spec

    spec = parse_spec({"model": {"builtin": "tiny"}, "resources": SERVING_SIZE,
                       "scaling": {"warmPool": {"min": 1, "resources": WARM_SIZE}}})
    sizes = pod_sizes(spec)
    cfg = client.Configuration()
    config.load_kube_config(str(real.kubeconfig), client_configuration=cfg)
    api = client.ApiClient(cfg)
    monkeypatch.setattr(kube, "_SHARED", api)
    core = client.CoreV1Api(api)

    # The endpoint's pod template as the operator builds it (labels, deletion cost, resources, resizePolicy),
    # running a small HTTP server from the operator image in place of the model server.
    template = pod_template("ep", spec)
    c = template["spec"]["containers"][0]
    assert c["name"] == CONTAINER and c["resizePolicy"]
    c.update(image=OPERATOR_IMAGE, imagePullPolicy="Never", securityContext=RESTRICTED,
             command=["python3", "-m", "http.server", "8000", "--directory", "/opt"], args=[],
             readinessProbe={"tcpSocket": {"port": 8000}, "periodSeconds": 1})
    c.pop("livenessProbe")
    c.pop("lifecycle")  # its preStop sleep would outlast the test pods' 1 s grace period
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": n, "namespace": ns},
             "spec": {**template["spec"], "terminationGracePeriodSeconds": 1}} for n in ("ep-a", "ep-b")]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ep", "namespace": ns},
           "spec": {"selector": serving_selector("ep"), "ports": [{"port": 80, "targetPort": 8000}]}}
    client_pod = pod("client", OPERATOR_IMAGE, ["python3", "-c", "import time; time.sleep(3600)"], cpu="100m",
                     memory="64Mi")
    client_pod["metadata"]["namespace"] = ns
    apply(real, *pods, svc, client_pod)
    wait("both pods and the client Ready", lambda: all(running(real, n, ns) for n in ("ep-a", "ep-b", "client")),
         timeout=180)

    def views() -> list[actuation.PodView]:
        items = core.list_namespaced_pod(ns, label_selector=selector_string(selector_labels("ep"))).items
        return [actuation.pod_view(api.sanitize_for_serialization(p)) for p in items]

    def containers() -> dict[str, tuple[str, int]]:
        return {n: (lambda s: (s["containerID"], s["restartCount"]))(get(real, "pod", n, ns)["status"]["containerStatuses"][0])
                for n in ("ep-a", "ep-b")}

    serving_cgroup = cgroup_size(real, "ep-a", ns)
    assert serving_cgroup["cpu"] == pytest.approx(float(warm_size.quantity(SERVING_SIZE["limits"]["cpu"])))
    born = containers()
    # Both Ready and warm at the serving size they loaded at: the plan shrinks both, in place.
    down = actuation.plan(views(), serving=0, total=2, current_replicas=2, sizes=sizes)
    assert sorted((r.name, r.up) for r in down.resize) == [("ep-a", False), ("ep-b", False)]
    t0 = time.monotonic()
    scale.scale(ns, "ep", down)
    warm_cpu = float(warm_size.quantity(WARM_SIZE["limits"]["cpu"]))
    for n in ("ep-a", "ep-b"):
        wait(f"{n} at the warm size", lambda n=n: cgroup_size(real, n, ns)["cpu"] == pytest.approx(warm_cpu), timeout=60)
    shrink_s = time.monotonic() - t0
    warm_cgroup = cgroup_size(real, "ep-b", ns)
    assert containers() == born  # no restart
    assert actuation.plan(views(), serving=0, total=2, current_replicas=2, sizes=sizes).resize == ()

    # Promote one: the plan resizes it up before the relabel that puts it in the Service.
    up = actuation.plan(views(), serving=1, total=2, current_replicas=2, sizes=sizes)
    assert len(up.promote) == 1 and [(r.name, r.up) for r in up.resize] == [(up.promote[0], True)]
    promoted = up.promote[0]
    other = ({"ep-a", "ep-b"} - {promoted}).pop()
    ip = get(real, "service", "ep", ns)["spec"]["clusterIP"]
    quota_watch = watcher(real, ns, promoted, WATCH_QUOTA, "60")
    serve_watch = watcher(real, ns, "client", WATCH_SERVICE, f"http://{ip}/", "60")
    t_promote = time.time()
    scale.scale(ns, "ep", up)
    applied_s = time.time() - t_promote
    to_cgroup_s = watched_time(quota_watch) - t_promote
    to_serving_s = watched_time(serve_watch) - t_promote
    assert get(real, "pod", promoted, ns)["metadata"]["labels"][LABEL_ROLE] == "serving"
    assert cgroup_size(real, promoted, ns)["cpu"] == pytest.approx(serving_cgroup["cpu"])
    assert cgroup_size(real, other, ns)["cpu"] == pytest.approx(warm_cpu)
    assert containers() == born  # still the same containers, never restarted
    status = get(real, "pod", promoted, ns)["status"]["containerStatuses"][0]
    assert warm_size.same(status["resources"], sizes[0])
    assert actuation.plan(views(), serving=1, total=2, current_replicas=2, sizes=sizes).resize == ()

    # The fraction the kernel's sizes give, priced by the spec's cost model, is the one status reports.
    gib = spec.scaling.warm_pool.memory_cost_per_gib
    measured = ((warm_cgroup["cpu"] + warm_cgroup["memory"] / 2**30 * gib)
                / (serving_cgroup["cpu"] + serving_cgroup["memory"] / 2**30 * gib))
    assert measured == pytest.approx(spec.warm_cost_fraction(), rel=1e-6)
    figures = {"shrink_both_s": round(shrink_s, 3), "promotion_api_calls_s": round(applied_s, 3),
               "promotion_to_cgroup_s": round(to_cgroup_s, 3), "promotion_to_serving_s": round(to_serving_s, 3),
               "serving_cgroup": serving_cgroup, "warm_cgroup": warm_cgroup, "warm_cost_fraction": round(measured, 4)}
    print(f"\nwarm pool resized in place: {json.dumps(figures)}")
    Path(real.state_dir / "warm-resize.json").write_text(json.dumps(figures) + "\n")


REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart" / "preheat"
SAMPLE = REPO / "crds" / "samples" / "tiny-cpu.yaml"
PSS_RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


@pytest.fixture(scope="module")
def release(real, model_server_image: str) -> Iterator[dict]:
    """The chart installed as a user would, with the operator image built from operator/Dockerfile
    (pullPolicy Never: only what `make images` built), its own ServiceAccount and RBAC, in a namespace
    enforcing the restricted Pod Security Standard; the sample endpoint in another such namespace."""
    rel = {"name": "preheat", "namespace": "preheat-system", "apps": "preheat-apps",
           "endpoint": yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]}
    for n in (rel["namespace"], rel["apps"]):
        apply(real, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": PSS_RESTRICTED}})
    sets = ["operator.image.repository=preheat/operator", "operator.image.tag=dev", "operator.image.pullPolicy=Never",
            "modelServer.image.tag=dev", f"prometheus.url={real.prometheus_url_for_pods}",
            "operator.extraArgs[0]=--interval=5"]
    helm = [str(real.bin_dir / "helm"), f"--kubeconfig={real.kubeconfig}"]
    t0 = time.monotonic()
    r = subprocess.run([*helm, "install", rel["name"], str(CHART), "-n", rel["namespace"], "--wait", "--timeout", "4m",
                        *[a for v in sets for a in ("--set", v)]], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"helm install: {r.stderr[-2000:]}"
    rel["installed_s"] = time.monotonic() - t0
    kc(real, "apply", "-n", rel["apps"], "-f", str(SAMPLE))
    try:
        yield rel
    finally:
        kc(real, "delete", "inferenceendpoint", rel["endpoint"], "-n", rel["apps"], "--wait=false", check=False)
        subprocess.run([*helm, "uninstall", rel["name"], "-n", rel["namespace"], "--wait", "--timeout", "60s"],
                       capture_output=True, timeout=120)


def operator_report(cluster, release: dict) -> str:
    """What a failure to reconcile needs: each operator replica's log tail, the peering object (which
    replica is active) and the endpoint as the API server holds it, with its Events."""
    out = []
    pods = json.loads(kc(cluster, "get", "pods", "-n", release["namespace"], "-o", "json").stdout)["items"]
    for p in pods:
        name = p["metadata"]["name"]
        logs = kc(cluster, "logs", name, "-n", release["namespace"], "--tail=60", check=False)
        out.append(f"--- log of {name} ---\n{logs.stdout}{logs.stderr}")
    peering = kc(cluster, "get", "clusterkopfpeerings", "-o", "jsonpath={.items[*].status}", check=False)
    out.append(f"--- peers ---\n{peering.stdout}{peering.stderr}")
    # The endpoint's finalizers and conditions (its annotations hold Kopf's and the forecaster's state).
    ie = kc(cluster, "get", "inferenceendpoint", release["endpoint"], "-n", release["apps"], "-o", "json", check=False)
    if ie.returncode == 0:
        obj = json.loads(ie.stdout)
        brief = {"finalizers": obj["metadata"].get("finalizers"), "conditions": obj.get("status", {}).get("conditions")}
        out.append(f"--- endpoint ---\n{json.dumps(brief, indent=1)}")
    else:
        out.append(f"--- endpoint ---\n{ie.stderr}")
    events = kc(cluster, "get", "events", "-n", release["apps"], check=False)
    out.append(f"--- events ---\n{events.stdout[-3000:]}{events.stderr}")
    return "\n".join(out)


def endpoint_pods(cluster, ns: str, endpoint: str) -> list[dict]:
    """The endpoint's live pods: not terminating, on a node that is still Ready."""
    ready_nodes = {n["metadata"]["name"] for n in json.loads(kc(cluster, "get", "nodes", "-o", "json").stdout)["items"]
                   if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])}
    items = json.loads(kc(cluster, "get", "pods", "-n", ns, "-l", f"preheat.dev/endpoint={endpoint}",
                          "-o", "json").stdout)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName") in ready_nodes]


def ready_by_role(pods: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in pods:
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])):
            out.setdefault(p["metadata"]["labels"].get("preheat.dev/role", "?"), []).append(p)
    return out


def serving_endpoints(cluster, ns: str, service: str) -> list[str]:
    """Pods behind the Service's ready EndpointSlice endpoints: what traffic reaches."""
    slices = json.loads(kc(cluster, "get", "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={service}",
                           "-o", "json").stdout)["items"]
    return [e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or []
            if e.get("conditions", {}).get("ready") and e.get("targetRef")]


def test_helm_installs_the_operator_image_which_reconciles_the_sample_with_its_own_rbac(real, release) -> None:
    ns, ep = release["apps"], release["endpoint"]
    operators = json.loads(kc(real, "get", "pods", "-n", release["namespace"], "-o", "json").stdout)["items"]
    assert len(operators) == 2 and all(p["status"]["phase"] == "Running" for p in operators)
    for p in operators:
        c = p["spec"]["containers"][0]
        assert c["image"] == "preheat/operator:dev" and c["imagePullPolicy"] == "Never"
        # Its own ServiceAccount (the chart's RBAC is what the API server enforces), not the default one.
        assert p["spec"]["serviceAccountName"] != "default"
        assert p["status"]["containerStatuses"][0]["imageID"], "no image ran"
    # Reconciled: the Deployment, Service and PDB exist, and a serving replica answers through the Service.
    # Within the operator's own bound for a watch that died without a word (handlers.configure: dropped
    # after 90 s, reconnected within 15 s), plus its start: how long it took is printed, not asserted.
    t0 = time.monotonic()
    try:
        for kind in ("deployment", "service", "poddisruptionbudget"):
            wait(f"{kind} {ep}", lambda k=kind: kc(real, "get", k, ep, "-n", ns, check=False).returncode == 0,
                 timeout=150)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{operator_report(real, release)}") from None
    print(f"\nreconciled by the chart's operator {time.monotonic() - t0:.1f} s into the test "
          f"(helm install took {release['installed_s']:.1f} s)")
    wait("a Ready serving replica behind the Service", lambda: serving_endpoints(real, ns, ep), timeout=300, every=2)
    # The operator pod reads the model servers' metrics from Prometheus, across the pods' own network
    # namespaces: the endpoint's signal is observed, not missing.
    def metrics_available() -> dict | None:
        status = get(real, "inferenceendpoint", ep, ns).get("status", {})
        cond = next((c for c in status.get("conditions", []) if c["type"] == "MetricsAvailable"), {})
        return status if cond.get("status") == "True" and status.get("observedSignal") is not None else None

    ie = {"status": wait("MetricsAvailable and an observed signal", metrics_available, timeout=180, every=2)}
    assert ie["status"].get("servingReplicas", 0) >= 1, ie["status"]
    ready = next(c for c in ie["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    # The model-server pods were admitted by the restricted standard and run as the image's non-root user.
    for p in endpoint_pods(real, ns, ep):
        assert p["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is True
    logs = "".join(kc(real, "logs", "-n", release["namespace"], p["metadata"]["name"], check=False).stdout
                   for p in operators)
    # Lines about another test's namespace are left out: one being deleted draws a 403 from the API server's
    # NamespaceLifecycle, not from RBAC.
    ours = (f'"namespace": "{release["namespace"]}"', f'"namespace": "{ns}"')
    refused = [line for line in logs.splitlines() if PERMISSION_ERROR.search(line)
               and ('"namespace":' not in line or any(n in line for n in ours))]
    assert not refused, "the operator's RBAC was refused:\n" + "\n".join(refused[:20])
    print(f"\nhelm install --wait took {release['installed_s']:.1f}s; endpoint status {json.dumps(ie['status'].get('servingReplicas'))} serving")


def test_losing_a_node_reschedules_its_pods_and_the_endpoint_gets_its_serving_count_back(real, ns: str, release) -> None:
    """The node that holds the endpoint's serving replica is
    stopped (kubelet and containerd): the endpoint must serve again at its desired count from the other
    node, and a plain Deployment's spread replicas all come back there."""
    from preheat_cluster import procs

    apps, ep = release["apps"], release["endpoint"]
    template = pod("x", OPERATOR_IMAGE, ["python3", "-c", "import time; time.sleep(3600)"], cpu="100m", memory="64Mi")
    spec = template["spec"]
    spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                          "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "spread"}}}]
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "spread", "namespace": ns},
              "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "spread"}},
                       "template": {"metadata": {"labels": {"app": "spread"}}, "spec": spec}}}
    apply(real, deploy)

    def pods_by_node() -> dict[str, list[str]]:
        items = json.loads(kc(real, "get", "pods", "-n", ns, "-l", "app=spread", "-o", "json").stdout)["items"]
        out: dict[str, list[str]] = {}
        for p in items:
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            if ready and not p["metadata"].get("deletionTimestamp"):
                out.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
        return out

    wait("4 replicas Ready on both nodes", lambda: sum(map(len, pods_by_node().values())) == 4 and len(pods_by_node()) == 2)
    desired = get(real, "deployment", ep, apps)["spec"]["replicas"]
    roles = wait(f"the endpoint's {desired} pods Ready", lambda: (lambda r: r if sum(map(len, r.values())) == desired and
                 r.get("serving") else None)(ready_by_role(endpoint_pods(real, apps, ep))), timeout=300, every=2)
    serving_want = len(roles["serving"])
    lost = roles["serving"][0]["spec"]["nodeName"]
    kept = ({"preheat-node-1", "preheat-node-2"} - {lost}).pop()
    index = lost.rsplit("-", 1)[1]
    print(f"\nendpoint before: {({k: [p['spec']['nodeName'] for p in v] for k, v in roles.items()})}; stopping {lost}")
    pids = real.component_pids()
    t0 = time.monotonic()
    assert procs.terminate([pids[f"kubelet-{index}"], pids[f"containerd-{index}"]], grace_s=5) == []

    def serving_again() -> bool:
        pods = {p["metadata"]["name"]: p for p in endpoint_pods(real, apps, ep)}
        behind = [n for n in serving_endpoints(real, apps, ep) if n in pods]
        return len(behind) >= serving_want and all(pods[n]["spec"]["nodeName"] == kept for n in behind)

    wait(f"{serving_want} serving replica(s) behind the Service on {kept}", serving_again, timeout=240, every=1)
    serving_s = time.monotonic() - t0
    wait(f"the endpoint's {desired} pods Ready on {kept}",
         lambda: sum(map(len, ready_by_role(endpoint_pods(real, apps, ep)).values())) >= desired, timeout=300, every=2)
    endpoint_s = time.monotonic() - t0
    wait(f"all 4 spread replicas Ready on {kept}", lambda: len(pods_by_node().get(kept, [])) == 4 and not pods_by_node().get(lost),
         timeout=180, every=1)
    took = time.monotonic() - t0
    node = get(real, "node", lost, "default")
    assert any(c["type"] == "Ready" and c["status"] != "True" for c in node["status"]["conditions"])
    # The node comes back on its kept state, for the tests after this one: Ready again, and the pods it held
    # while it was away (already replaced elsewhere) are removed from it.
    t1 = time.monotonic()
    real.restart_node(int(index))
    wait(f"{lost} Ready again", lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                                              get(real, "node", lost, "default")["status"]["conditions"]), timeout=180, every=1)
    wait(f"the pods replaced while {lost} was away gone from it",
         lambda: not [p for p in json.loads(kc(real, "get", "pods", "-A", "--field-selector", f"spec.nodeName={lost}",
                                                    "-o", "json").stdout)["items"]
                      if p["metadata"].get("deletionTimestamp")], timeout=180, every=1)
    node_back_s = time.monotonic() - t1
    figures = {"lost_node": lost, "serving_back_s": round(serving_s, 1), "endpoint_back_s": round(endpoint_s, 1),
               "deployment_back_s": round(took, 1), "serving_replicas": serving_want, "endpoint_replicas": desired,
               "node_ready_again_s": round(node_back_s, 1)}
    print(f"\nnode lost: {json.dumps(figures)}")
    Path(real.state_dir / "node-loss.json").write_text(json.dumps(figures) + "\n")
