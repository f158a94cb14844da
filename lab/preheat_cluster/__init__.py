"""Test and demo infrastructure: a local Kubernetes made of the real components (etcd, kube-apiserver,
controller-manager, scheduler) plus a node agent that runs pods as local processes, and Prometheus."""

from .launcher import ClusterError, LocalCluster, default_bin_dir, kubectl, missing_binaries

__all__ = ["ClusterError", "LocalCluster", "default_bin_dir", "kubectl", "missing_binaries"]
