"""Test and demo infrastructure: a local Kubernetes made of the real components (etcd, kube-apiserver,
controller-manager, scheduler), two real nodes (kubelet + containerd each, kube-proxy, CoreDNS) and
Prometheus, all inside Preheat's network namespace."""

from .launcher import ClusterError, LocalCluster, default_bin_dir, kubectl, missing_binaries

__all__ = ["ClusterError", "LocalCluster", "default_bin_dir", "kubectl", "missing_binaries"]
