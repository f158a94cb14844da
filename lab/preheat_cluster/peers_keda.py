"""KEDA (`github.com/kedacore/keda/v2`, built by `cluster/build-peers.sh keda`) on the local cluster:
keda-operator (ScaledObject controller; it creates the HPA and answers metric queries over gRPC) and
keda-adapter (KEDA's metrics server: external.metrics.k8s.io, which kube-controller-manager's HPA reads,
forwarding each query to the operator).

As upstream's config/ deploys them, with these differences: both run as host processes of the cluster
(`down` stops them) under a token of the upstream ServiceAccount `keda-operator` with the upstream RBAC
(config/rbac and config/metrics-server, copied by the build); the webhooks are left out; certificates
come from the cluster CA instead of the operator's own rotation (`--enable-cert-rotation=false`): one
cert for server and client, in the cert dir layout both expect (ca.crt, tls.crt, tls.key), so the
operator's gRPC server and the adapter's client authenticate each other (mutual TLS) as upstream.
Nothing here implements ClusterIPs, so as for prometheus-adapter (peers.py) the metrics server's
Service has no selector and our EndpointSlice names the peers' address, and the adapter dials the
operator's gRPC port at that address. Ports on that address are upstream's except where another peer
holds it: the adapter serves on 6444 (prometheus-adapter holds 6443) and the operator's health probe
is on 8082 (AIBrix holds 8081)."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

from .launcher import LocalCluster, pinned_versions
from .peers import (
    _apply,
    _token_kubeconfig,
    apply_crds,
    check_alive,
    endpoint_slice,
    kustomize,
    peer_address,
    peer_binary,
    peer_manifests,
    wait_api_available,
)
from .pki import issue_cert

OPERATOR, ADAPTER = "keda-operator", "keda-adapter"
NAMESPACE = "keda"
SERVICE_ACCOUNT = "keda-operator"
METRICS_SERVICE = "keda-metrics-apiserver"
GRPC_PORT = 9666  # --metrics-service-bind-address's default
OPERATOR_METRICS_PORT = 8080
OPERATOR_PROBE_PORT = 8082
ADAPTER_PORT = 6444
# The adapter's own /metrics server binds every address (":PORT", no flag for the address): a port no
# pod (8000) and no cluster component (20000-32000) uses.
ADAPTER_METRICS_PORT = 9022
EXTERNAL_METRICS_API = "v1beta1.external.metrics.k8s.io"


def scaled_object(name: str, *, query: str, threshold: str, server_address: str,
                  min_replicas: int = 1, max_replicas: int = 3) -> dict:
    """A ScaledObject of a Deployment `name` with one `prometheus` trigger, as KEDA's Prometheus scaler
    docs write it (serverAddress, query, threshold: the target value per replica, KEDA's default
    AverageValue metric type). Everything else is KEDA's default (30 s polling, 300 s cooldown, the
    HPA's own behavior). Pure."""
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"name": name},
                     "minReplicaCount": min_replicas, "maxReplicaCount": max_replicas,
                     "triggers": [{"type": "prometheus", "metadata": {
                         "serverAddress": server_address, "query": query, "threshold": threshold}}]}}


def keda_manifests(upstream_rbac: list[dict], address: str, ca_bundle: bytes) -> list[dict]:
    """The namespace, the upstream RBAC, the metrics server's Service (upstream service.yaml's https
    port, 443 -> ADAPTER_PORT here) with our EndpointSlice, and the external metrics APIService
    verified against the cluster CA (upstream's cert rotation patches in its own CA). Pure."""
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
           "spec": {"ports": [{"name": "https", "port": 443, "targetPort": ADAPTER_PORT}]}}
    api = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": EXTERNAL_METRICS_API},
           "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                    "service": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "port": 443},
                    "caBundle": base64.b64encode(ca_bundle).decode(),
                    "groupPriorityMinimum": 100, "versionPriority": 100}}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            *kustomize(upstream_rbac, namespace=NAMESPACE), svc,
            endpoint_slice(METRICS_SERVICE, NAMESPACE, address, {"https": ADAPTER_PORT}), api]


def _cert_dir(cluster: LocalCluster, d: Path, address: str) -> Path:
    """ca.crt, tls.crt, tls.key as the kedaorg-certs Secret would mount them: a cert valid for the
    operator's and the metrics server's Service names and the peers' address, for serving and as a
    client (the adapter's gRPC client cert)."""
    names = [f"{s}.{NAMESPACE}.svc{suffix}" for s in (OPERATOR, METRICS_SERVICE) for suffix in ("", ".cluster.local")]
    crt, key = issue_cert(cluster.pki, "keda", cn=OPERATOR, org=None, server=True, client=True, dns=names, ips=[address])
    certs = d / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    for src, dst in ((cluster.pki.ca_crt, "ca.crt"), (crt, "tls.crt"), (key, "tls.key")):
        shutil.copyfile(src, certs / dst)
    (certs / "tls.key").chmod(0o600)
    return certs


def start_keda(cluster: LocalCluster, *, timeout_s: float = 180.0) -> str:
    """Run keda-operator and keda-adapter and wait until external.metrics.k8s.io is Available; returns
    KEDA's version. Idempotent."""
    version = pinned_versions()["KEDA_VERSION"]
    operator, adapter = peer_binary(cluster, OPERATOR, "keda"), peer_binary(cluster, ADAPTER, "keda")
    pids = cluster.component_pids()
    if OPERATOR in pids and ADAPTER in pids:
        check_alive(cluster, OPERATOR, ADAPTER)
        return version
    crds = peer_manifests(cluster, "keda", version, "crds")
    rbac = peer_manifests(cluster, "keda", version, "rbac")
    d = cluster.state_dir / "peers" / "keda"
    d.mkdir(parents=True, exist_ok=True)
    address = peer_address(cluster)
    certs = _cert_dir(cluster, d, address)
    apply_crds(cluster, crds)
    manifests = keda_manifests(rbac, address, cluster.pki.ca_crt.read_bytes())
    _apply(cluster, manifests[:-1])
    kc = d / "kubeconfig"
    _token_kubeconfig(cluster, kc, SERVICE_ACCOUNT, NAMESPACE)
    # Upstream's Deployments set these from the downward API; KEDA_CLUSTER_OBJECT_NAMESPACE is otherwise
    # read from the pod's mounted ServiceAccount namespace file.
    env = {"WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
           "KUBECONFIG": str(kc)}
    cluster._start(OPERATOR, [
        str(operator), "--zap-log-level=info", "--zap-encoder=console", "--zap-time-encoding=rfc3339",
        "--enable-cert-rotation=false", f"--cert-dir={certs}",
        f"--metrics-bind-address={address}:{OPERATOR_METRICS_PORT}",
        f"--health-probe-bind-address={address}:{OPERATOR_PROBE_PORT}",
        f"--metrics-service-bind-address={address}:{GRPC_PORT}",
    ], env=env)
    cluster._start(ADAPTER, [
        str(adapter), f"--bind-address={address}", f"--secure-port={ADAPTER_PORT}", "--zap-log-level=info",
        f"--client-ca-file={certs / 'ca.crt'}", f"--tls-cert-file={certs / 'tls.crt'}",
        f"--tls-private-key-file={certs / 'tls.key'}", f"--cert-dir={certs}",
        f"--lister-kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        f"--metrics-service-address={address}:{GRPC_PORT}", f"--port={ADAPTER_METRICS_PORT}",
    ], env=env)
    _apply(cluster, manifests[-1:])
    wait_api_available(cluster, [EXTERNAL_METRICS_API], timeout_s, (OPERATOR, ADAPTER))
    return version
