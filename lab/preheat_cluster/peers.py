"""The autoscalers Preheat is compared with, run on the local cluster as their upstream projects deploy
them: prometheus-adapter (the HPA's custom metrics API, `sigs.k8s.io/prometheus-adapter`), built by
`cluster/build-peers.sh prometheus-adapter`; the HPA itself is kube-controller-manager's. KEDA
(peers_keda.py) and AIBrix (peers_aibrix.py) use the helpers here.

The adapter runs as a host process of the cluster (like the control plane; `down` stops it), with its
own upstream ServiceAccount and RBAC (deploy/manifests of v0.12.0) and the upstream Deployment's
flags, behind an APIService. The one deviation, because nothing here implements ClusterIPs: the
Service has no selector and an EndpointSlice of ours points at the address the adapter listens on,
which the API server's aggregator dials (`--enable-aggregator-routing=true`)."""

from __future__ import annotations

import base64
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


def peer_binary(cluster: LocalCluster, name: str, build: str) -> Path:
    """A built peer binary; a clear error naming the command that builds it when it is not there."""
    p = cluster.bin_dir / name
    if not os.access(p, os.X_OK):
        raise ClusterError(f"{p} not found: run `bash cluster/build-peers.sh {build}`")
    return p


def adapter_binary(cluster: LocalCluster) -> Path:
    """The built adapter; a clear error (with the command that builds it) when it is not there."""
    return peer_binary(cluster, ADAPTER, "prometheus-adapter (scripts/test.sh builds it beside the cluster's binaries)")


def peer_manifests(cluster: LocalCluster, peer: str, version: str, kind: str) -> list[dict]:
    """The upstream manifests cluster/build-peers.sh copied from a peer's module (`kind`: crds, rbac),
    every document of every file in name order."""
    d = cluster.bin_dir.parent / "peers" / f"{peer}-{version}" / kind
    files = sorted(d.glob("*.yaml"))
    if not files:
        raise ClusterError(f"no {kind} manifests in {d}: run `bash cluster/build-peers.sh {peer}`")
    return [o for f in files for o in yaml.safe_load_all(f.read_text()) if o]


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "APIService"}


def kustomize(objs: list[dict], *, namespace: str, name_prefix: str = "") -> list[dict]:
    """What an upstream kustomization's `namespace:` and `namePrefix:` do to RBAC manifests: namespaced
    objects move to `namespace`, every object's name gets the prefix, and the references follow (a
    binding's roleRef and ServiceAccount subjects when they are `objs`' own). References to anything
    else (system:auth-delegator, kube-system's horizontal-pod-autoscaler) and objects placed in another
    namespace on purpose (kube-system's auth-reader binding) keep theirs. Pure."""
    own = {(o["kind"], o["metadata"]["name"]) for o in objs}
    out = []
    for o in objs:
        o = json.loads(json.dumps(o))
        md = o["metadata"]
        if o["kind"] not in CLUSTER_SCOPED and md.get("namespace") in (None, "system"):
            md["namespace"] = namespace
        md["name"] = name_prefix + md["name"]
        ref = o.get("roleRef")
        if ref and (ref["kind"], ref["name"]) in own:
            ref["name"] = name_prefix + ref["name"]
        for sub in o.get("subjects", []):
            if sub.get("kind") == "ServiceAccount" and ("ServiceAccount", sub["name"]) in own:
                sub["name"], sub["namespace"] = name_prefix + sub["name"], namespace
        out.append(o)
    return out


def endpoint_slice(service: str, namespace: str, address: str, ports: dict[str, int]) -> dict:
    """Our EndpointSlice for a selector-less Service: `address` (the peers' address) with named ports."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": service, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": "preheat-lab"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports.items()]}


def peer_address(cluster: LocalCluster) -> str:
    """Where the peers (host processes) listen: the address of this host that pods and the API server's
    aggregation layer reach, so an EndpointSlice can name it (loopback addresses are refused)."""
    return cluster.host_address_for_pods


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
    eps = endpoint_slice(ADAPTER, ADAPTER_NAMESPACE, address, {"https": ADAPTER_PORT})
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


def apply_crds(cluster: LocalCluster, crds: list[dict], timeout_s: float = 60.0) -> None:
    """Server-side apply (KEDA's ScaledObject CRD is over the 256 KiB a client-side apply's annotation
    may hold), then wait until each is Established."""
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(crds))
    names = [f"crd/{c['metadata']['name']}" for c in crds]
    kubectl(cluster, "wait", "--for=condition=Established", f"--timeout={int(timeout_s)}s", *names)


def _token_kubeconfig(cluster: LocalCluster, path: Path, sa: str = ADAPTER, namespace: str = ADAPTER_NAMESPACE) -> None:
    """A kubeconfig with a token of a peer's ServiceAccount (what its pod would mount)."""
    token = kubectl(cluster, "create", "token", sa, "-n", namespace, "--duration=48h").strip()
    cfg = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "local", "cluster": {
               "server": cluster.api_server_url,
               "certificate-authority-data": base64.b64encode(cluster.pki.ca_crt.read_bytes()).decode()}}],
           "users": [{"name": sa, "user": {"token": token}}],
           "contexts": [{"name": "local", "context": {"cluster": "local", "user": sa}}],
           "current-context": "local"}
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)


def start_prometheus_adapter(cluster: LocalCluster, rules: dict, *, timeout_s: float = 120.0) -> str:
    """Run prometheus-adapter against the cluster's Prometheus with `rules` and wait until the API
    server reports custom.metrics.k8s.io Available; returns the adapter's version. Idempotent."""
    binary = adapter_binary(cluster)
    pid = cluster.component_pids().get(ADAPTER)
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


def check_alive(cluster: LocalCluster, *names: str) -> None:
    """A ClusterError with the log's tail when one of the peer processes `names` has exited."""
    for name in names:
        pid = cluster.component_pids().get(name)
        if pid and not procs.alive(pid):
            log = cluster.logs_dir / f"{name}.log"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log.exists() else "(no log)"
            raise ClusterError(f"{name} exited; see {log}:\n{tail}")


def wait_api_available(cluster: LocalCluster, names: list[str], timeout_s: float,
                       procs_: tuple[str, ...] = (ADAPTER,)) -> None:
    """Until every APIService is Available=True; the error carries the API server's reason, or the
    serving process's log tail when it exited."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        check_alive(cluster, *procs_)
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
