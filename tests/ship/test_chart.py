"""The Helm chart without a cluster: lint, copies in step with their sources, least-privilege RBAC,
the operator Deployment's shape, and the optional Prometheus Operator objects."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from .tools import (
    CHART,
    CRD,
    DASHBOARD,
    REPO,
    RULES,
    by_kind,
    dashboard_builder,
    dashboard_renderer,
    find_tool,
    helm_template,
    one,
    run,
)


@pytest.fixture(scope="module")
def helm() -> str:
    return find_tool("helm")


@pytest.fixture(scope="module")
def default_objects(helm: str) -> list[dict]:
    return helm_template(helm)


def test_helm_lint_is_clean(helm: str) -> None:
    proc = run([helm, "lint", "--strict", str(CHART)])
    assert "0 chart(s) failed" in proc.stdout, proc.stdout
    # --strict turns warnings into failures; also say so if helm only printed [INFO] lines.
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
    proc = run(
        [
            helm,
            "lint",
            "--strict",
            str(CHART),
            "--set",
            "watchNamespaces={ml,chat}",
            "--set",
            "monitoring.podMonitor.enabled=true",
            "--set",
            "monitoring.serviceMonitor.enabled=true",
            "--set",
            "monitoring.prometheusRule.enabled=true",
        ]
    )
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_chart_crd_is_the_generated_crd() -> None:
    assert (CHART / "crds" / "inferenceendpoint.yaml").read_text() == CRD.read_text(), (
        "manifests/chart/preheat/crds/inferenceendpoint.yaml differs from crds/inferenceendpoint.yaml: "
        "cp crds/inferenceendpoint.yaml manifests/chart/preheat/crds/"
    )


def test_chart_copies_of_dashboard_and_rules_are_current() -> None:
    assert DASHBOARD.read_text() == dashboard_builder().render(), (
        "run manifests/dashboards/build_dashboard.py"
    )
    assert (CHART / "files" / "preheat.json").read_text() == DASHBOARD.read_text()
    assert (CHART / "files" / "preheat-rules.yaml").read_text() == RULES.read_text(), (
        "cp manifests/alerts/preheat-rules.yaml manifests/chart/preheat/files/"
    )


def _rules(objs: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for o in objs:
        if o["kind"] in ("ClusterRole", "Role"):
            out += [(o["metadata"]["name"], r) for r in o["rules"]]
    return out


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={ml,chat}",)], ids=["all-namespaces", "namespaced"])
def test_rbac_is_least_privilege(helm: str, sets: tuple[str, ...]) -> None:
    objs = helm_template(helm, *sets)
    rules = _rules(objs)
    assert rules
    for name, r in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in r.get(field, []), f"{name}: wildcard in {field}: {r}"
        # The operator never deletes (owner references + garbage collection do) and never needs
        # secrets, configmaps, RBAC objects, or to impersonate/escalate.
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate", "update"} & set(
            r["verbs"]
        ), r
        assert not {
            "secrets",
            "configmaps",
            "roles",
            "clusterroles",
            "rolebindings",
            "clusterrolebindings",
            "pods/exec",
            "nodes",
            "serviceaccounts/token",
        } & set(r["resources"]), r
    granted = {
        (g, res, v) for _, r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]
    }
    # What reconciling an endpoint needs (docs/ship.md lists the code path behind each).
    for need in [
        ("preheat.dev", "inferenceendpoints", "watch"),
        ("preheat.dev", "inferenceendpoints/status", "patch"),
        ("apps", "deployments", "create"),
        ("apps", "deployments", "patch"),
        ("", "services", "create"),
        ("", "pods", "patch"),
        ("", "events", "create"),
        ("policy", "poddisruptionbudgets", "create"),
    ]:
        assert need in granted, f"missing {need}"
    if sets:
        # Namespaced mode: endpoint permissions only in the listed namespaces.
        roles = by_kind(objs, "Role")
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["chat", "ml"]
        cluster_resources = {
            res for cr in by_kind(objs, "ClusterRole") for r in cr["rules"] for res in r["resources"]
        }
        assert cluster_resources == {"customresourcedefinitions", "namespaces"}
        assert sorted(p["metadata"]["namespace"] for p in by_kind(objs, "KopfPeering")) == ["chat", "ml"]
        args = one(objs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--namespace=ml" in args and "--namespace=chat" in args and "--all-namespaces" not in args


def test_operator_statefulset_shape(default_objects: list[dict]) -> None:
    dep = one(default_objects, "StatefulSet")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    # The image's ENTRYPOINT runs (no command override), with peering so two replicas are safe.
    assert "command" not in container
    assert container["image"].startswith("preheat/operator:")
    peering = one(default_objects, "ClusterKopfPeering")["metadata"]["name"]
    assert f"--peering={peering}" in container["args"]
    assert "--all-namespaces" in container["args"]
    sa = one(default_objects, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == sa
    binding = one(default_objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "preheat-system"}]
    # Non-root, read-only root filesystem, nothing extra.
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
    ann = spec["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == str(
        next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    )
    assert one(default_objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_dashboard_configmap_for_grafana_sidecar(default_objects: list[dict]) -> None:
    cms = [
        o
        for o in by_kind(default_objects, "ConfigMap")
        if o["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    assert len(cms) == 1
    assert cms[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cms[0]["data"]["preheat.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_picture_reads_prometheus_values_as_grafana_does() -> None:
    # query_range values are [unix time, "string"]; Prometheus writes NaN and +Inf as strings. A series
    # with no finite value draws nothing (the install test's every-panel-has-data check then fails).
    xs, ys, finite = dashboard_renderer().series_points([[1700000000, "0.5"], [1700000005, "NaN"], [1700000010, "+Inf"]])
    assert [x.timestamp() for x in xs] == [1700000000, 1700000005, 1700000010]
    assert ys[0] == 0.5 and ys[1] != ys[1] and ys[2] == float("inf")
    assert finite == 1
    assert dashboard_renderer().series_points([[1700000000, "NaN"]])[2] == 0


def test_prometheus_operator_objects_are_optional(helm: str, default_objects: list[dict]) -> None:
    kinds = {o["kind"] for o in default_objects}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    objs = helm_template(
        helm,
        "monitoring.podMonitor.enabled=true",
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
    )
    rule = one(objs, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    pm = one(objs, "PodMonitor")
    targets = {r["targetLabel"] for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert targets == {"endpoint", "role"}
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] is True


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("serviceAccount.create=false", "serviceAccount.name is required"),
        # values.schema.json: a misspelt key, a URL without scheme, zero replicas.
        ("watchNamespace=ml", "additional properties 'watchNamespace' not allowed"),
        ("prometheus.url=prometheus:9090", "does not match pattern"),
        ("operator.replicas=0", "/operator/replicas"),
        ("monitoring.podMonitor.interval=15", "/monitoring/podMonitor/interval"),
    ],
)
def test_bad_values_fail_with_a_message(helm: str, setting: str, message: str) -> None:
    proc = run([helm, "template", "x", str(CHART), "--set", setting], check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "sets",
    [(), ("watchNamespaces={ml,chat}", "operator.verbose=true", "operator.extraArgs={--reactive-only}")],
)
def test_operator_cli_accepts_the_charts_arguments(helm: str, sets: tuple[str, ...]) -> None:
    # The chart's args, expanded the way the kubelet expands $(VAR) from the container's env, must
    # parse with the operator's own argument parser (a misspelt flag would crash-loop the pod).
    from preheat.controller.cli import parse_args

    (container,) = one(helm_template(helm, *sets), "StatefulSet")["spec"]["template"]["spec"]["containers"]
    env = {"POD_IP": "10.1.2.3", "POD_INDEX": "1"}
    declared = {e["name"] for e in container["env"]}
    args = []
    for a in container["args"]:
        for var in re.findall(r"\$\((\w+)\)", a):
            assert var in declared, f"{a} uses $({var}) but the container has no such env var"
            a = a.replace(f"$({var})", env[var])
        args.append(a)
    parsed = parse_args(args)
    assert parsed.peering == "preheat" and parsed.priority == 1
    assert parsed.metrics_addr == "10.1.2.3" and parsed.metrics_port == 8080
    if sets:
        assert parsed.namespace == ["ml", "chat"] and parsed.verbose and parsed.reactive_only
    else:
        assert parsed.all_namespaces and parsed.namespace == []


# Kubernetes client method resource → (API group, resource). The operator's only custom object is
# its own InferenceEndpoint.
_CLIENT_RESOURCES = {
    "deployment": ("apps", "deployments"),
    "service": ("", "services"),
    "pod": ("", "pods"),
    "pod_disruption_budget": ("policy", "poddisruptionbudgets"),
    "custom_object": ("preheat.dev", "inferenceendpoints"),
    "event": ("", "events"),
}
_CLIENT_VERBS = {
    "read": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
# What Kopf itself does (not visible as client calls in the operator's code).
_KOPF = {
    ("preheat.dev", "inferenceendpoints", "list"),
    ("preheat.dev", "inferenceendpoints", "watch"),
    ("preheat.dev", "inferenceendpoints", "patch"),
    ("", "events", "create"),
    ("kopf.dev", "clusterkopfpeerings", "list"),
    ("kopf.dev", "clusterkopfpeerings", "watch"),
    ("kopf.dev", "clusterkopfpeerings", "patch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}


def operator_api_calls() -> set[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of every Kubernetes client call in the operator's runtime code."""
    calls = set()
    pattern = re.compile(r"\.(read|list|create|patch|replace|delete)_namespaced_(\w+?)(_status|_scale|_resize)?\(")
    for path in (REPO / "operator" / "preheat" / "controller").glob("*.py"):
        if path.name.startswith("bench"):  # benchmarks run as the cluster admin, not as the operator
            continue
        for verb, kind, sub in pattern.findall(path.read_text()):
            assert kind in _CLIENT_RESOURCES, (
                f"{path.name}: unmapped client call {verb}_namespaced_{kind}{sub}"
            )
            group, resource = _CLIENT_RESOURCES[kind]
            calls.add((group, resource + (f"/{sub[1:]}" if sub else ""), _CLIENT_VERBS[verb]))
    return calls


def test_rbac_grants_exactly_what_the_operator_code_calls(default_objects: list[dict]) -> None:
    granted = set()
    for _, r in _rules(default_objects):
        granted |= {(g, res, v) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    needed = operator_api_calls() | _KOPF
    assert needed - granted == set(), (
        f"the operator calls these but the chart does not grant them: {needed - granted}"
    )
    assert granted - needed == set(), f"granted but never used (not least privilege): {granted - needed}"
