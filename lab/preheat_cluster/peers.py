"""The autoscalers Preheat is compared with, run on the local cluster as their upstream projects deploy
them. So far: prometheus-adapter (the HPA's custom metrics API, `sigs.k8s.io/prometheus-adapter`),
built by `cluster/build-peers.sh prometheus-adapter`; the HPA itself is kube-controller-manager's.

The adapter runs as a host process of the cluster (like the control plane; `down` stops it), with its
own upstream ServiceAccount and RBAC (deploy/manifests of v0.12.0) and the upstream Deployment's
flags, behind an APIService. The one deviation, because nothing here implements ClusterIPs: the
Service has no selector and an EndpointSlice of ours points at the address the adapter listens on,
which the API server's aggregator dials (`--enable-aggregator-routing=true`)."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import time
from pathlib import Path

import yaml

from . import procs
from .launcher import ClusterError, LocalCluster, kubectl, pinned_versions
from .pki import issue_cert

ADAPTER = "prometheus-adapter"
ADAPTER_NAMESPACE = "monitoring"  # upstream deploy/manifests' namespace
ADAPTER_PORT = 6443  # upstream Deployment's --secure-port
# The upstream Deployment's --metrics-relist-interval (the binary's default is 10m).
ADAPTER_RELIST = "1m"
CUSTOM_METRICS_VERSIONS = ("v1beta1", "v1beta2")  # what custom-metrics-apiserver v1.30 serves


def adapter_binary(cluster: LocalCluster) -> Path:
    """The built adapter; a clear error (with the command that builds it) when it is not there."""
    p = cluster.bin_dir / ADAPTER
    if not os.access(p, os.X_OK):
        raise ClusterError(f"{p} not found: run `bash cluster/build-peers.sh prometheus-adapter` "
                           "(scripts/test.sh builds it beside the cluster's binaries)")
    return p


def peer_address(cluster: LocalCluster) -> str:
    """An address of the cluster's pod block that the node agent never hands a pod (its last octet is
    255): where the peers listen, so an EndpointSlice can name it (loopback addresses are refused)."""
    net = ipaddress.ip_network(cluster.pod_cidr)
    return str(net.network_address + 255)


def request_rate_rules(metric: str = "preheat:requests_received_total", window: str = "2m") -> dict:
    """prometheus-adapter rules exposing a counter as a per-pod rate, as docs/config-walkthrough.md of
    v0.12.0 writes it (name `<x>_total` -> `<x>_per_second`, `sum(rate(...[2m])) by (...)`). The series
    is the one Preheat's own rate query reads (operator/preheat/controller/observe.py)."""
    return {"rules": [{
        "seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": "^(.*)_total$", "as": "${1}_per_second"},
        "metricsQuery": f"sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[{window}])) by (<<.GroupBy>>)",
    }]}


def _rbac_manifests() -> list[dict]:
    """deploy/manifests of prometheus-adapter v0.12.0: its ServiceAccount, ClusterRole (read pods,
    namespaces, nodes, services), the auth-delegator binding (TokenReview/SubjectAccessReview for the
    requests the aggregator forwards) and the extension-apiserver-authentication reader binding."""
    sa = {"kind": "ServiceAccount", "name": ADAPTER, "namespace": ADAPTER_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ADAPTER_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ADAPTER, "namespace": ADAPTER_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": ADAPTER},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "namespaces", "pods", "services"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": ADAPTER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ADAPTER},
         "subjects": [sa]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "resource-metrics:system:auth-delegator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": [sa]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "resource-metrics-auth-reader", "namespace": "kube-system"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"},
         "subjects": [sa]},
    ]


def _routing_manifests(address: str, ca_bundle: bytes) -> list[dict]:
    """The Service (upstream service.yaml: 443 -> https 6443), our EndpointSlice for it, and one
    APIService per custom.metrics.k8s.io version, verified against the cluster CA (upstream's
    metrics.k8s.io APIService skips verification; nothing needs that here)."""
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": ADAPTER, "namespace": ADAPTER_NAMESPACE},
           "spec": {"ports": [{"name": "https", "port": 443, "targetPort": ADAPTER_PORT}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": ADAPTER, "namespace": ADAPTER_NAMESPACE,
                        "labels": {"kubernetes.io/service-name": ADAPTER,
                                   "endpointslice.kubernetes.io/managed-by": "preheat-lab"}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
           "ports": [{"name": "https", "port": ADAPTER_PORT, "protocol": "TCP"}]}
    api = [{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"{v}.custom.metrics.k8s.io"},
            "spec": {"group": "custom.metrics.k8s.io", "version": v,
                     "service": {"name": ADAPTER, "namespace": ADAPTER_NAMESPACE, "port": 443},
                     "caBundle": base64.b64encode(ca_bundle).decode(),
                     "groupPriorityMinimum": 100, "versionPriority": 200 if v == "v1beta2" else 100}}
           for v in CUSTOM_METRICS_VERSIONS]
    return [svc, eps, *api]


def _apply(cluster: LocalCluster, objs: list[dict]) -> None:
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump_all(objs))


def _token_kubeconfig(cluster: LocalCluster, path: Path) -> None:
    """A kubeconfig with a token of the adapter's ServiceAccount (what its pod would mount)."""
    token = kubectl(cluster, "create", "token", ADAPTER, "-n", ADAPTER_NAMESPACE, "--duration=48h").strip()
    cfg = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "local", "cluster": {
               "server": cluster.api_server_url,
               "certificate-authority-data": base64.b64encode(cluster.pki.ca_crt.read_bytes()).decode()}}],
           "users": [{"name": ADAPTER, "user": {"token": token}}],
           "contexts": [{"name": "local", "context": {"cluster": "local", "user": ADAPTER}}],
           "current-context": "local"}
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)


def start_prometheus_adapter(cluster: LocalCluster, rules: dict, *, timeout_s: float = 120.0) -> str:
    """Run prometheus-adapter against the cluster's Prometheus with `rules` and wait until the API
    server reports custom.metrics.k8s.io Available; returns the adapter's version. Idempotent."""
    binary = adapter_binary(cluster)
    pid = cluster.component_pids().get(ADAPTER)
    from . import procs
    if pid and procs.alive(pid):
        return pinned_versions()["PROMETHEUS_ADAPTER_VERSION"]
    d = cluster.state_dir / "peers" / ADAPTER
    d.mkdir(parents=True, exist_ok=True)
    address = peer_address(cluster)
    crt, key = issue_cert(cluster.pki, ADAPTER, cn=ADAPTER, org=None, server=True, client=False,
                          dns=[f"{ADAPTER}.{ADAPTER_NAMESPACE}.svc", f"{ADAPTER}.{ADAPTER_NAMESPACE}.svc.cluster.local"],
                          ips=[address])
    (d / "config.yaml").write_text(yaml.safe_dump(rules))
    _apply(cluster, _rbac_manifests())
    kc = d / "kubeconfig"
    _token_kubeconfig(cluster, kc)
    cluster._start(ADAPTER, [
        str(binary), f"--bind-address={address}", f"--secure-port={ADAPTER_PORT}",
        f"--tls-cert-file={crt}", f"--tls-private-key-file={key}", f"--cert-dir={d / 'certs'}",
        f"--config={d / 'config.yaml'}", f"--metrics-relist-interval={ADAPTER_RELIST}",
        f"--prometheus-url={cluster.prometheus_url}/",
        f"--lister-kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--v=2",
    ])
    _apply(cluster, _routing_manifests(address, cluster.pki.ca_crt.read_bytes()))
    wait_api_available(cluster, [f"{v}.custom.metrics.k8s.io" for v in CUSTOM_METRICS_VERSIONS], timeout_s)
    return pinned_versions()["PROMETHEUS_ADAPTER_VERSION"]


def wait_api_available(cluster: LocalCluster, names: list[str], timeout_s: float) -> None:
    """Until every APIService is Available=True; the error carries the API server's reason and the
    adapter's log tail."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        pid = cluster.component_pids().get(ADAPTER)
        if pid and not procs.alive(pid):
            raise ClusterError(f"{ADAPTER} exited; see {cluster.logs_dir / (ADAPTER + '.log')}")
        conds = []
        for n in names:
            obj = json.loads(kubectl(cluster, "get", "apiservice", n, "-o", "json"))
            c = next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Available"), {})
            conds.append((n, c.get("status"), c.get("reason"), c.get("message", "")))
        if all(c[1] == "True" for c in conds):
            return
        last = "; ".join(f"{n}: {s} {r} {m}" for n, s, r, m in conds)
        time.sleep(1)
    raise ClusterError(f"APIServices not Available after {timeout_s:.0f}s: {last}")
