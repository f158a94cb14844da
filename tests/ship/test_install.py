"""Install the chart for real on the local cluster and use it the way a user would.

One release per module (installing takes most of the time): the operator runs as two pods on the real
nodes with the chart's service-account token, so the chart's RBAC is what the API server
enforces. The tests: server-side dry run of the rendered manifests, the sample endpoint reconciled with
no 403 in the operator's logs, every dashboard query returning data after real requests, and
`helm uninstall` removing what it installed. The last one uninstalls, so it stays last in this file.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from .tools import CHART, DASHBOARD, REPO, Kube, dashboard_renderer, find_tool, run
from .workload import dashboard_queries, prometheus_query_range, send_requests, serving_addresses, substitute

pytestmark = pytest.mark.cluster
PERMISSION_ERROR = re.compile(r"\b403\b|forbidden", re.IGNORECASE)

SAMPLE = REPO / "crds" / "samples" / "tiny-cpu.yaml"
# The operator's decision interval in this test (its --interval flag): short so scale decisions,
# forecasts and the forecast-error gauge all exist within the test's budget.
INTERVAL_S = 5


@dataclass
class Release:
    kube: Kube
    name: str
    namespace: str
    apps_namespace: str
    endpoint: str
    prometheus_url: str
    handle: Any
    installed_at: float

    @property
    def service_account(self) -> str:
        return f"{self.name}-operator" if "preheat" in self.name else f"{self.name}-preheat-operator"

    def operator_pods(self) -> list[dict[str, Any]]:
        pods = self.kube.get_json(
            "pods",
            "-n",
            self.namespace,
            "-l",
            f"app.kubernetes.io/name=preheat-operator,app.kubernetes.io/instance={self.name}",
        )
        return pods["items"]

    def operator_log(self, pod: str) -> str:
        if self.handle.cluster is not None:
            path = Path(self.handle.pod_log_path(self.namespace, pod))
            return path.read_text(errors="replace") if path.exists() else ""
        return self.kube.kubectl("logs", "-n", self.namespace, pod, "--all-containers", check=False).stdout


def _wait(what: str, check, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def _deployment_ready(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    if not kube.exists("deployment", name, "-n", ns):
        return None
    dep = kube.get_json("deployment", name, "-n", ns)
    want = dep["spec"].get("replicas", 1)
    ready = dep.get("status", {}).get("readyReplicas", 0)
    return dep if want >= 1 and ready >= want else None


def _diagnosis(rel: Release) -> str:
    """What a reader of a failed install needs: the operator pods and their log tails, the endpoint's
    status, the apps namespace's pods and recent Events (the fixture's waits fail with this)."""
    out = []
    for pod in rel.operator_pods():
        st = pod.get("status", {})
        cs = [(c["name"], c.get("ready"), c.get("restartCount"), c.get("state")) for c in st.get("containerStatuses", [])]
        out.append(f"operator pod {pod['metadata']['name']}: phase {st.get('phase')}, containers {cs}")
        out += ["  " + line for line in rel.operator_log(pod["metadata"]["name"]).splitlines()[-25:]]
    for what in (("get", "inferenceendpoint", rel.endpoint, "-o", "jsonpath={.status}"),
                 ("get", "pods", "-o", "wide"),
                 ("get", "events", "--sort-by=.lastTimestamp")):
        proc = rel.kube.kubectl(*what, "-n", rel.apps_namespace, check=False)
        out.append(f"kubectl {' '.join(what)}:\n{proc.stdout[-3000:]}{proc.stderr[-500:]}")
    proc = rel.kube.kubectl("get", "events", "--sort-by=.lastTimestamp", "-n", rel.namespace, check=False)
    out.append(f"events in {rel.namespace}:\n{proc.stdout[-2000:]}")
    return "\n".join(out)


@pytest.fixture(scope="module")
def release(local_cluster) -> Iterator[Release]:
    kubectl = find_tool("kubectl", local_cluster.bin_dir)
    helm = find_tool("helm", local_cluster.bin_dir)
    kube = Kube(local_cluster.kubeconfig, kubectl, helm)
    suffix = uuid.uuid4().hex[:6]
    rel = Release(
        kube=kube,
        name=f"preheat-{suffix}",
        namespace=f"ship-{suffix}-system",
        apps_namespace=f"ship-{suffix}-apps",
        endpoint=yaml.safe_load(SAMPLE.read_text())["metadata"]["name"],
        prometheus_url=local_cluster.prometheus_url,
        handle=local_cluster,
        installed_at=time.time(),
    )
    sets = [
        f"prometheus.url={local_cluster.prometheus_url_for_pods}",
        f"operator.extraArgs[0]=--interval={INTERVAL_S}",
    ]
    if image_tag := os.environ.get("PREHEAT_IMAGE_TAG"):
        sets += [f"operator.image.tag={image_tag}", f"modelServer.image.tag={image_tag}"]
    argv = [
        "install",
        rel.name,
        str(CHART),
        "--namespace",
        rel.namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        "3m",
    ]
    for s in sets:
        argv += ["--set", s]
    try:
        kube.helm(*argv, timeout=240)
        kube.kubectl("create", "namespace", rel.apps_namespace)
        kube.kubectl("apply", "-n", rel.apps_namespace, "-f", str(SAMPLE))
        # Reconciled = a serving replica is Ready behind the Service (the model load takes a while on a
        # busy 2-core machine, hence the generous bound).
        try:
            _wait(
                f"Deployment {rel.endpoint} ready",
                lambda: _deployment_ready(kube, rel.apps_namespace, rel.endpoint),
                timeout=300,
            )
            _wait(
                f"a serving endpoint of {rel.endpoint}",
                lambda: serving_addresses(kube, rel.apps_namespace, rel.endpoint),
                timeout=120,
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_diagnosis(rel)}") from None
        yield rel
    finally:
        # Best effort: the endpoint first (the operator must still run to release its finalizer).
        kube.kubectl(
            "delete",
            "inferenceendpoint",
            rel.endpoint,
            "-n",
            rel.apps_namespace,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        kube.helm(
            "uninstall",
            rel.name,
            "--namespace",
            rel.namespace,
            "--wait",
            "--timeout",
            "90s",
            check=False,
            timeout=120,
        )
        for ns in (rel.apps_namespace, rel.namespace):
            kube.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)


def test_rendered_manifests_pass_server_side_dry_run(release: Release) -> None:
    # A second, differently named release rendered in both RBAC modes, checked by the API server
    # itself (schema, admission) without persisting anything. The CRDs exist from the real install.
    for extra in ([], ["--set", f"watchNamespaces={{{release.apps_namespace}}}"]):
        rendered = run(
            [
                release.kube.helm_bin,
                "template",
                "dryrun",
                str(CHART),
                "--namespace",
                release.namespace,
                "--include-crds",
                "--set",
                "monitoring.scrapeAnnotations=true",
                *extra,
            ]
        ).stdout
        proc = release.kube.kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=ship-test",
            "--force-conflicts",
            "-f",
            "-",
            input=rendered,
        )
        applied = [line for line in proc.stdout.splitlines() if line.strip()]
        kinds = {line.split("/")[0].split(".")[0] for line in applied}
        assert {
            "customresourcedefinition",
            "serviceaccount",
            "clusterrole",
            "statefulset",
            "configmap",
        } <= kinds, proc.stdout


def test_operator_reconciles_sample_with_its_own_rbac(release: Release) -> None:
    kube, ns = release.kube, release.apps_namespace
    ie = kube.get_json("inferenceendpoint", release.endpoint, "-n", ns)
    dep = kube.get_json("deployment", release.endpoint, "-n", ns)
    assert [o["kind"] for o in dep["metadata"]["ownerReferences"]] == ["InferenceEndpoint"]
    assert dep["metadata"]["ownerReferences"][0]["uid"] == ie["metadata"]["uid"]
    assert kube.exists("service", release.endpoint, "-n", ns)
    assert kube.exists("poddisruptionbudget", release.endpoint, "-n", ns)
    conditions = {
        c["type"]: c
        for c in _wait(
            "status conditions on the endpoint",
            lambda: (
                kube.get_json("inferenceendpoint", release.endpoint, "-n", ns)
                .get("status", {})
                .get("conditions")
            ),
            timeout=60,
        )
    }
    assert conditions, ie

    # The operator pods run with the chart's service account, and that account can do exactly what the
    # chart grants: the API server says no to what it does not.
    pods = release.operator_pods()
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    sa = {p["spec"]["serviceAccountName"] for p in pods}
    assert sa == {release.service_account}
    who = f"system:serviceaccount:{release.namespace}:{release.service_account}"

    def can(verb: str, resource: str, *extra: str) -> bool:
        out = kube.kubectl(
            "auth", "can-i", verb, resource, *extra, "-n", ns, "--as", who, check=False
        ).stdout.strip()
        return out == "yes"

    assert (
        can("patch", "deployments.apps/scale") and can("create", "deployments.apps") and can("patch", "pods")
        and can("patch", "pods", "--subresource=resize")  # warmPool.resources: a pod resized in place
    )
    assert not can("delete", "deployments.apps") and not can("get", "secrets") and not can("delete", "pods")

    # Kopf peering: both replicas registered, with distinct priorities (one active, one standby).
    peering = kube.get_json("clusterkopfpeering", release.name)
    peers = peering.get("status") or {}
    assert len(peers) == 2, peers
    assert len({p["priority"] for p in peers.values()}) == 2, peers

    # No 403 in either replica's log about the release's own namespaces or the cluster, and the active one
    # did handle the sample. (The chart's operator watches every namespace: another test's endpoint in a
    # namespace being deleted draws a 403 from the API server's NamespaceLifecycle, not from RBAC.)
    ours = (f'"namespace": "{release.namespace}"', f'"namespace": "{release.apps_namespace}"')
    logs = {p["metadata"]["name"]: release.operator_log(p["metadata"]["name"]) for p in pods}
    for pod, text in logs.items():
        assert text, f"no log from operator pod {pod}"
        # A word match: the kubelet's log prefix (a nanosecond timestamp) holds "403" by chance.
        bad = [line for line in text.splitlines() if PERMISSION_ERROR.search(line)
               and ('"namespace":' not in line or any(n in line for n in ours))]
        assert not bad, f"{pod}: permission errors with the chart's RBAC:\n" + "\n".join(bad[:20])
    assert any(release.endpoint in text for text in logs.values()), "no operator log line mentions the sample"


def test_every_dashboard_query_returns_data(release: Release, tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    values = {"namespace": release.apps_namespace, "endpoint": release.endpoint, "__rate_interval": "30s"}
    started = time.time()
    # Real completions to the serving pods (addresses from the Service's EndpointSlices), some with
    # a shared prefix so the prefix cache has something to hit.
    sent = send_requests(release.kube, release.handle, release.apps_namespace, release.endpoint, seconds=30)
    assert sent["ok"] > 0, sent

    queries = dashboard_queries(dashboard)
    assert len(queries) >= 10
    pending = dict(queries)
    deadline = time.monotonic() + 120
    results: dict[str, str] = {}
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            promql = substitute(expr, values)
            series = prometheus_query_range(release.prometheus_url, promql, started - 60, time.time(), step=5)
            finite = [s for s in series if any(math.isfinite(float(v)) for _, v in s["values"])]
            if finite:
                del pending[key]
            else:
                results[key] = f"{promql} -> {len(series)} series, none with a finite value"
        if pending:
            # Keep a light load going: rate() panels need arrivals inside their window.
            send_requests(release.kube, release.handle, release.apps_namespace, release.endpoint, seconds=5)
    assert not pending, "dashboard queries without data:\n" + "\n".join(results[k] for k in pending)

    # The template variables list this endpoint, and the annotation queries are valid PromQL.
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        q = substitute(var["definition"], values)
        label = q.split(",")[-1].strip(" )")
        match = q[len("label_values(") : q.rindex(",")]
        got = run(
            [
                "curl",
                "-fsS",
                "-G",
                f"{release.prometheus_url}/api/v1/label/{label}/values",
                "--data-urlencode",
                f"match[]={match}",
            ]
        ).stdout
        assert values[var["name"]] in json.loads(got)["data"], (var["name"], got)
    for ann in dashboard["annotations"]["list"]:
        if "expr" in ann:
            prometheus_query_range(
                release.prometheus_url, substitute(ann["expr"], values), started, time.time(), 5
            )

    # The same data drawn as users see it (render_png.py): every panel has a line. PREHEAT_DASHBOARD_PNG
    # keeps the picture (the README's manifests/dashboards/preheat-dashboard.png is drawn this way).
    png = Path(os.environ.get("PREHEAT_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    drawn = dashboard_renderer().render(dashboard, release.prometheus_url, values, started - 60, time.time(), png)
    assert drawn and all(drawn.values()), drawn
    assert png.stat().st_size > 10_000


def test_helm_uninstall_cleans_up(release: Release) -> None:
    kube = release.kube
    # The endpoint goes first, while the operator still runs: its finalizer is released and the
    # Deployment is garbage-collected through the owner reference.
    kube.kubectl(
        "delete",
        "inferenceendpoint",
        release.endpoint,
        "-n",
        release.apps_namespace,
        "--wait=true",
        "--timeout=60s",
        timeout=90,
    )
    kube.helm(
        "uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", "90s", timeout=120
    )
    leftovers = [
        ("statefulset", f"{release.service_account}", "-n", release.namespace),
        ("serviceaccount", release.service_account, "-n", release.namespace),
        ("clusterrole", release.service_account),
        ("clusterrolebinding", release.service_account),
        ("clusterkopfpeering", release.name),
        ("configmap", f"{release.name}-dashboard", "-n", release.namespace),
        ("service", f"{release.service_account}-metrics", "-n", release.namespace),
    ]
    for args in leftovers:
        assert not kube.exists(*args), f"left behind after helm uninstall: {args}"
    _wait("operator pods gone", lambda: not release.operator_pods(), timeout=60)
    _wait(
        f"Deployment {release.endpoint} garbage-collected",
        lambda: not kube.exists("deployment", release.endpoint, "-n", release.apps_namespace),
        timeout=60,
    )
    # Helm never deletes CRDs from crds/ (that would delete every user's endpoints): documented.
    assert kube.exists("crd", "inferenceendpoints.preheat.dev")
