"""Shared pytest fixtures: the local Kubernetes cluster (session-scoped) and per-test helpers.

`local_cluster` brings the cluster up once per pytest session and down at the end. It reuses a cluster
that is already up in `.cluster/` (`make cluster-up`) and then leaves it running; with
`PREHEAT_KUBECONFIG` and `PREHEAT_PROMETHEUS_URL` set it uses that cluster instead (the kind e2e);
with `PREHEAT_CLUSTER_DIR` set it runs its own local cluster in that state dir.
Missing binaries FAIL the tests that need the cluster, with the command that builds them."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class ClusterHandle:
    """What a test gets: the kubeconfig, the Prometheus URL and the dir with kubectl and helm.
    `cluster` is the `LocalCluster` when the session runs the local one (None for an external
    cluster): tests that stop Prometheus or register host scrape targets need it."""

    kubeconfig: Path
    prometheus_url: str
    bin_dir: Path
    cluster: object | None = None

    @property
    def prometheus_url_for_pods(self) -> str:
        """Prometheus as a pod reaches it (on the local cluster a pod's loopback is its own)."""
        return self.cluster.prometheus_url_for_pods if self.cluster is not None else self.prometheus_url

    def pod_log_path(self, namespace: str, pod: str, container: str | None = None) -> Path:
        if self.cluster is None:
            raise RuntimeError("pod log files exist only on the local cluster (use kubectl logs elsewhere)")
        return self.cluster.pod_log_path(namespace, pod, container)


def _external() -> ClusterHandle | None:
    kc, prom = os.environ.get("PREHEAT_KUBECONFIG"), os.environ.get("PREHEAT_PROMETHEUS_URL")
    if not (kc and prom):
        return None
    kubectl = shutil.which("kubectl")
    bin_dir = Path(os.environ.get("PREHEAT_BIN_DIR") or (Path(kubectl).parent if kubectl else "/usr/local/bin"))
    return ClusterHandle(Path(kc), prom.rstrip("/"), bin_dir)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[ClusterHandle]:
    ext = _external()
    if ext is not None:
        yield ext
        return
    from preheat_cluster import ClusterError, LocalCluster, missing_binaries

    # PREHEAT_CLUSTER_DIR gives a session its own cluster (another state dir, other ports).
    state_dir = os.environ.get("PREHEAT_CLUSTER_DIR")
    cluster = LocalCluster(state_dir=Path(state_dir)) if state_dir else LocalCluster()
    missing = missing_binaries(cluster.bin_dir)
    if missing:
        pytest.fail(
            f"the local cluster needs {missing} in {cluster.bin_dir}: run `make binaries` "
            "(bash cluster/build-binaries.sh all)", pytrace=False)
    # Several pytest sessions (developers working side by side) share one cluster in .cluster/:
    # the lock serialises bring-up, and each session registers itself as a user so only the last
    # one out takes down a cluster that a pytest session started.
    # The lock lives outside the state dir, which `down` removes.
    lock_path = Path(tempfile.gettempdir()) / f"preheat-cluster-{hashlib.sha1(str(cluster.state_dir).encode()).hexdigest()[:12]}.lock"
    users = cluster.state_dir / "pytest-users"
    me = users / str(os.getpid())
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            started_here = not cluster.is_up()
            if started_here:
                try:
                    took = cluster.up()
                except ClusterError as e:
                    pytest.fail(f"local cluster did not come up: {e}", pytrace=False)
                print(f"\nlocal cluster ready in {took:.1f}s")
                (cluster.state_dir / "started-by-pytest").write_text(str(os.getpid()))
            users.mkdir(parents=True, exist_ok=True)
            me.write_text(str(os.getpid()))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        yield ClusterHandle(cluster.kubeconfig, cluster.prometheus_url, cluster.bin_dir, cluster)
    finally:
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                me.unlink(missing_ok=True)
                others = [p for p in users.glob("*") if _pid_alive(int(p.name))] if users.exists() else []
                if not others and (cluster.state_dir / "started-by-pytest").exists():
                    cluster.down()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@pytest.fixture(scope="session")
def kube_api(local_cluster: ClusterHandle):
    """A `kubernetes.client.ApiClient` for the cluster's admin kubeconfig."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(local_cluster.kubeconfig), client_configuration=cfg)
    api = client.ApiClient(cfg)
    yield api
    api.close()


@pytest.fixture
def namespace(kube_api) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount ready, so pods are admitted), deleted after."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(kube_api)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"preheat.dev/test": "true"}}})
    deadline = time.monotonic() + 60
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield name
    try:
        # Background deletion: the namespace controller and the kubelets clean up; the test need not wait.
        core.delete_namespace(name, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise
