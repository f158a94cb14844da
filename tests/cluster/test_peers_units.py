"""Unit tests of the peers' manifest builders (preheat_cluster.peers, peers_keda, peers_aibrix): no
cluster, no binaries. The upstream RBAC here is a trimmed copy of what cluster/build-peers.sh copies
(AIBrix v0.7.0 config/rbac/controller-manager, KEDA v2.21.0 config/rbac and config/metrics-server)."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from preheat_cluster.launcher import ClusterError, LocalCluster
from preheat_cluster.peers import kustomize, peer_binary, peer_manifests

AIBRIX_RBAC = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "controller-manager", "namespace": "system"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "controller-manager-role"},
     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "controller-manager-rolebinding"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "controller-manager-role"},
     "subjects": [{"kind": "ServiceAccount", "name": "controller-manager", "namespace": "system"}]},
]

KEDA_RBAC = [
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "keda-operator", "namespace": "keda"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "keda-operator"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "keda-auth-reader", "namespace": "kube-system"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                 "name": "extension-apiserver-authentication-reader"},
     "subjects": [{"kind": "ServiceAccount", "name": "keda-operator", "namespace": "keda"}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "keda-hpa-controller-external-metrics"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "keda-external-metrics-reader"},
     "subjects": [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}]},
]


def test_kustomize_applies_namespace_and_prefix_to_own_objects_and_references() -> None:
    """config/default's `namespace: aibrix-system` + `namePrefix: aibrix-`: the ServiceAccount, role and
    binding are renamed together, so the binding still grants the role to the ServiceAccount."""
    out = {o["kind"]: o for o in kustomize(AIBRIX_RBAC, namespace="aibrix-system", name_prefix="aibrix-")}
    assert out["ServiceAccount"]["metadata"] == {"name": "aibrix-controller-manager", "namespace": "aibrix-system"}
    assert out["ClusterRole"]["metadata"] == {"name": "aibrix-controller-manager-role"}  # cluster-scoped: no namespace
    b = out["ClusterRoleBinding"]
    assert b["roleRef"]["name"] == "aibrix-controller-manager-role"
    assert b["subjects"] == [{"kind": "ServiceAccount", "name": "aibrix-controller-manager", "namespace": "aibrix-system"}]
    assert AIBRIX_RBAC[0]["metadata"]["namespace"] == "system"  # the input is left alone


def test_kustomize_keeps_foreign_references_and_deliberate_namespaces() -> None:
    """KEDA's reader binding lives in kube-system on purpose, refers to a system Role, and the HPA
    controller's ServiceAccount is kube-system's, not KEDA's."""
    out = {o["metadata"]["name"]: o for o in kustomize(KEDA_RBAC, namespace="keda")}
    reader = out["keda-auth-reader"]
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    assert reader["subjects"] == [{"kind": "ServiceAccount", "name": "keda-operator", "namespace": "keda"}]
    hpa = out["keda-hpa-controller-external-metrics"]
    assert hpa["subjects"] == [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}]
    assert hpa["roleRef"]["name"] == "keda-external-metrics-reader"


def test_aibrix_pod_autoscaler_scrapes_pods_for_a_vllm_metric() -> None:
    from preheat_cluster.peers_aibrix import SERVICE_ACCOUNT, pod_autoscaler, rbac_manifests

    pa = pod_autoscaler("m", metric="num_requests_running", target="1")
    assert pa["apiVersion"] == "autoscaling.aibrix.ai/v1alpha1" and pa["kind"] == "PodAutoscaler"
    spec = pa["spec"]
    assert spec["scalingStrategy"] == "KPA" and (spec["minReplicas"], spec["maxReplicas"]) == (1, 3)
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "m"}
    # The CRD types port and targetValue as strings; the model server serves /metrics on 8000.
    assert spec["metricsSources"] == [{"metricSourceType": "pod", "protocolType": "http", "port": "8000",
                                       "path": "metrics", "targetMetric": "num_requests_running", "targetValue": "1"}]
    objs = rbac_manifests(AIBRIX_RBAC)
    assert objs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "aibrix-system"}}
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"} == {SERVICE_ACCOUNT}


def test_keda_scaled_object_has_one_prometheus_trigger_and_keda_defaults() -> None:
    from preheat_cluster.peers_keda import scaled_object

    q = 'sum(rate(preheat:requests_received_total{namespace="ns",endpoint="m"}[1m]))'
    so = scaled_object("m", query=q, threshold="0.5", server_address="http://127.0.0.1:9090")
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"name": "m"}  # apps/v1 Deployment is KEDA's default target
    assert spec["triggers"] == [{"type": "prometheus", "metadata": {
        "serverAddress": "http://127.0.0.1:9090", "query": q, "threshold": "0.5"}}]
    # KEDA's own defaults for polling, cooldown and the HPA's behavior: none is set here.
    assert not {"pollingInterval", "cooldownPeriod", "advanced", "fallback"} & set(spec)


def test_keda_manifests_route_external_metrics_to_the_peer_address() -> None:
    from preheat_cluster.peers_keda import ADAPTER_PORT, keda_manifests

    objs = keda_manifests(KEDA_RBAC, "10.250.0.254", b"CA PEM")
    kinds = [o["kind"] for o in objs]
    assert kinds[0] == "Namespace" and kinds[-1] == "APIService"  # the APIService last: applied once serving
    svc = next(o for o in objs if o["kind"] == "Service")
    assert "selector" not in svc["spec"] and svc["spec"]["ports"][0]["targetPort"] == ADAPTER_PORT
    eps = next(o for o in objs if o["kind"] == "EndpointSlice")
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert eps["endpoints"][0]["addresses"] == ["10.250.0.254"] and eps["ports"][0]["port"] == ADAPTER_PORT
    api = objs[-1]
    assert api["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert api["spec"]["service"] == {"name": svc["metadata"]["name"], "namespace": "keda", "port": 443}
    assert base64.b64decode(api["spec"]["caBundle"]) == b"CA PEM"
    json.dumps(objs)  # plain data, as kubectl apply gets it


def test_missing_peer_binary_and_manifests_name_the_build_command(tmp_path) -> None:
    cluster = LocalCluster(state_dir=tmp_path / "state", bin_dir=tmp_path / "cache" / "bin")
    with pytest.raises(ClusterError, match=r"bash cluster/build-peers.sh keda"):
        peer_binary(cluster, "keda-operator", "keda")
    with pytest.raises(ClusterError, match=r"bash cluster/build-peers.sh aibrix"):
        peer_manifests(cluster, "aibrix", "v0.7.0", "rbac")
    d = tmp_path / "cache" / "peers" / "aibrix-v0.7.0" / "rbac"
    d.mkdir(parents=True)
    (d / "b.yaml").write_text(yaml.safe_dump_all(AIBRIX_RBAC[1:]))
    (d / "a.yaml").write_text("---\n" + yaml.safe_dump(AIBRIX_RBAC[0]))
    assert peer_manifests(cluster, "aibrix", "v0.7.0", "rbac") == AIBRIX_RBAC
