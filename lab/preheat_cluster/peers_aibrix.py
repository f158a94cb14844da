"""AIBrix's PodAutoscaler controller (`github.com/vllm-project/aibrix/cmd/controllers`, built by
`cluster/build-peers.sh aibrix`) on the local cluster.

As upstream's config/default deploys it, less what a PodAutoscaler does not need: one process of the
controller manager with only `--controllers=pod-autoscaler-controller` and `--disable-webhook`, under
its own ServiceAccount `aibrix-controller-manager` in `aibrix-system` with the upstream ClusterRole and
binding (config/rbac/controller-manager, copied by the build, kustomized as config/default does:
namespace aibrix-system, name prefix aibrix-), and the PodAutoscaler CRD. No aggregation layer: for a
`metricSourceType: pod` source it scrapes each pod's `/metrics` at the pod IP itself. The controller is
a host process in the cluster's network namespace, where the nodes' bridges are, so it reaches pod IPs
as it would from a pod.
Run as a host process of the cluster like the other peers (`down` stops it)."""

from __future__ import annotations

import time
import urllib.request

from .launcher import ClusterError, LocalCluster, pinned_versions
from .peers import (
    _apply,
    _token_kubeconfig,
    apply_crds,
    check_alive,
    kustomize,
    peer_address,
    peer_binary,
    peer_manifests,
)

AIBRIX = "aibrix-controllers"
NAMESPACE = "aibrix-system"  # upstream config/default's namespace and name prefix
PREFIX = "aibrix-"
SERVICE_ACCOUNT = PREFIX + "controller-manager"
PROBE_PORT = 8081  # upstream manager's --health-probe-bind-address=:8081, on the peers' address here


def pod_autoscaler(name: str, *, metric: str = "num_requests_running", target: str = "1",
                   strategy: str = "KPA", min_replicas: int = 1, max_replicas: int = 3, port: int = 8000) -> dict:
    """A PodAutoscaler of a Deployment `name` on a vLLM metric scraped from its pods, as AIBrix's
    samples/autoscaling/kpa.yaml writes one (metricSourceType pod, http, `metrics` path; AIBrix maps
    `num_requests_running` to vLLM's `vllm:num_requests_running`). Everything else (KPA's stable and
    panic windows, tolerances, scale-down delay) is AIBrix's default. Pure."""
    return {"apiVersion": "autoscaling.aibrix.ai/v1alpha1", "kind": "PodAutoscaler",
            "metadata": {"name": name},
            "spec": {"scalingStrategy": strategy, "minReplicas": min_replicas, "maxReplicas": max_replicas,
                     "metricsSources": [{"metricSourceType": "pod", "protocolType": "http", "port": str(port),
                                         "path": "metrics", "targetMetric": metric, "targetValue": target}],
                     "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}}}


def rbac_manifests(upstream: list[dict]) -> list[dict]:
    """The namespace and the upstream controller-manager RBAC as config/default applies it. Pure."""
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            *kustomize(upstream, namespace=NAMESPACE, name_prefix=PREFIX)]


def start_aibrix(cluster: LocalCluster, *, timeout_s: float = 120.0) -> str:
    """Run AIBrix's PodAutoscaler controller and wait until its manager is ready; returns its version.
    Idempotent."""
    version = pinned_versions()["AIBRIX_VERSION"]
    binary = peer_binary(cluster, AIBRIX, "aibrix")
    pid = cluster.component_pids().get(AIBRIX)
    if pid:
        check_alive(cluster, AIBRIX)
        return version
    crds = peer_manifests(cluster, "aibrix", version, "crds")
    rbac = peer_manifests(cluster, "aibrix", version, "rbac")
    d = cluster.state_dir / "peers" / AIBRIX
    d.mkdir(parents=True, exist_ok=True)
    apply_crds(cluster, crds)
    _apply(cluster, rbac_manifests(rbac))
    kc = d / "kubeconfig"
    _token_kubeconfig(cluster, kc, SERVICE_ACCOUNT, NAMESPACE)
    probe = f"{peer_address(cluster)}:{PROBE_PORT}"
    cluster._start(AIBRIX, [
        str(binary), f"--kubeconfig={kc}", "--controllers=pod-autoscaler-controller", "--disable-webhook",
        "--leader-elect=false", "--metrics-bind-address=0", f"--health-probe-bind-address={probe}",
    ])
    deadline, last = time.monotonic() + timeout_s, ""
    while True:
        check_alive(cluster, AIBRIX)
        try:
            with urllib.request.urlopen(f"http://{probe}/readyz", timeout=2) as r:
                if r.status == 200:
                    return version
        except OSError as e:
            last = str(e)
        if time.monotonic() > deadline:
            raise ClusterError(f"{AIBRIX} not ready after {timeout_s:.0f}s ({last}); "
                               f"see {cluster.logs_dir / (AIBRIX + '.log')}")
        time.sleep(1)
