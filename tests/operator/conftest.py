"""Fixtures for the operator's cluster tests: the CRD installed, and `preheat operator` as a real
process (one per test, watching only that test's namespace, so tests and other suites never share
an operator)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ophelpers import CRD, Cluster, OperatorProcess, kubectl


@pytest.fixture(scope="session")
def crd_installed(local_cluster) -> Any:
    kubectl(local_cluster, "apply", "-f", str(CRD))
    kubectl(local_cluster, "wait", "--for", "condition=Established", "--timeout=60s",
            "crd/inferenceendpoints.preheat.dev")
    return local_cluster



@pytest.fixture
def operator_factory(crd_installed, namespace, tmp_path) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def make(*extra: str) -> OperatorProcess:
        op = OperatorProcess(crd_installed, namespace, tmp_path / f"operator-{len(started)}.log", *extra).start()
        started.append(op)
        return op

    yield make
    # Delete the endpoints while an operator still runs: Kopf's daemons put a finalizer on each, and
    # a namespace whose endpoints nobody finalizes would stay Terminating.
    if any(op.proc is not None and op.proc.poll() is None for op in started):
        kubectl(crd_installed, "delete", "inferenceendpoints", "--all", "-n", namespace, "--wait=true",
                "--timeout=90s", check=False, timeout=120)
    for op in started:
        op.stop()

@pytest.fixture
def cluster_view(kube_api, namespace) -> Cluster:
    return Cluster(kube_api, namespace)
