"""Helpers for the operator's cluster tests: kubectl, the operator process, polling, reads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "inferenceendpoint.yaml"
SAMPLES = ROOT / "crds" / "samples"


def kubectl(handle: Any, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(handle.bin_dir / "kubectl"), "--kubeconfig", str(handle.kubeconfig), *args],
        input=input, capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    """`python -m preheat operator` against the test cluster, logging to a file."""

    def __init__(self, handle: Any, namespace: str, log_path: Path, *extra: str) -> None:
        self.handle, self.namespace, self.log_path = handle, namespace, log_path
        self.metrics_port = free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        env = dict(os.environ, KUBECONFIG=str(self.handle.kubeconfig))
        log = open(self.log_path, "a")  # noqa: SIM115 - the child keeps writing after we return
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "preheat", "operator", "--namespace", self.namespace,
             "--prometheus-url", self.handle.prometheus_url, "--metrics-port", str(self.metrics_port),
             "--metrics-addr", "127.0.0.1", "--log-format", "plain", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )
        log.close()
        return self

    def kill(self) -> None:
        """SIGKILL: the operator dies mid-action, as on a node failure."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def metrics_text(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()


def wait_for(fn: Callable[[], Any], timeout: float, what: str, op: OperatorProcess | None = None,
             interval: float = 1.0) -> Any:
    """Poll `fn` until it returns something truthy; fail with what was awaited and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as exc:  # a transient API error while objects come and go
            last = exc
        else:
            if last:
                return last
        if op is not None and op.proc is not None and op.proc.poll() is not None:
            raise AssertionError(f"operator exited ({op.proc.returncode}) while waiting for {what}:\n{op.log_tail()}")
        time.sleep(interval)
    tail = f"\noperator log:\n{op.log_tail()}" if op else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}{tail}")




class Cluster:
    """Reads for the assertions: the endpoint, its pods, its EndpointSlice (kubernetes client)."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client

        self.ns = namespace
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.discovery = client.DiscoveryV1Api(api)
        self.api = api

    def endpoint(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object("preheat.dev", "v1alpha1", self.ns, "inferenceendpoints", name)

    def status(self, name: str) -> dict:
        return self.endpoint(name).get("status") or {}

    def condition(self, name: str, type_: str) -> dict:
        for c in self.status(name).get("conditions") or []:
            if c["type"] == type_:
                return c
        return {}

    def create(self, body: dict) -> dict:
        return self.custom.create_namespaced_custom_object("preheat.dev", "v1alpha1", self.ns,
                                                           "inferenceendpoints", body)

    def patch_scaling(self, name: str, **scaling: Any) -> dict:
        """Merge-patch the endpoint's spec.scaling, as `kubectl patch --type merge` does."""
        return self.custom.patch_namespaced_custom_object("preheat.dev", "v1alpha1", self.ns, "inferenceendpoints",
                                                          name, {"spec": {"scaling": scaling}})

    def pods(self, name: str) -> list[dict]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"preheat.dev/endpoint={name}").items
        return [self.api.sanitize_for_serialization(p) for p in items]

    def live_pods(self, name: str) -> list[dict]:
        return [p for p in self.pods(name) if not p["metadata"].get("deletionTimestamp")]

    def events(self, name: str) -> list[dict]:
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [self.api.sanitize_for_serialization(e) for e in items]

    def slice_ips(self, service: str) -> set[str]:
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.ns, label_selector=f"kubernetes.io/service-name={service}").items
        ips = set()
        for s in slices:
            for ep in s.endpoints or []:
                if ep.conditions is None or ep.conditions.ready is not False:
                    ips.update(ep.addresses)
        return ips


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions") or [])


def role(pod: dict) -> str:
    return pod["metadata"]["labels"].get("preheat.dev/role", "")


def ready_by_role(pods: list[dict]) -> tuple[list[dict], list[dict]]:
    """(serving, warm): the Ready pods of each role."""
    ready = [p for p in pods if is_ready(p)]
    return [p for p in ready if role(p) == "serving"], [p for p in ready if role(p) == "warm"]




def lightweight_endpoint(name: str, **scaling: Any) -> dict:
    """An endpoint whose pods run the tiny mapped HTTP server (health routes + request metrics)."""
    base_scaling = {"minReplicas": 1, "maxReplicas": 4, "targetPerReplica": 1, "warmPool": {"min": 1, "max": 1},
                    "scaleDownStabilizationSeconds": 0, "intervalSeconds": 3}
    base_scaling.update(scaling)
    return {
        "apiVersion": "preheat.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name},
        "spec": {
            "model": {"builtin": "tiny"},
            "server": {"image": "preheat/lightweight-server:dev", "drainTimeoutSeconds": 1,
                       "extraArgs": ["--startup-delay-s", "1"]},
            "scaling": base_scaling,
            "prometheus": {"window": "30s", "panicWindow": "15s"},
        },
    }


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]


__all__ = ["Cluster", "OperatorProcess", "dump", "is_ready", "kubectl", "lightweight_endpoint",
           "role", "wait_for"]
