"""Where to send requests: the ready serving pods of an endpoint, read from its EndpointSlices.

The load generator does what a service mesh or an ingress does: it reads the Service's EndpointSlices
and balances across the ready addresses itself (per-request choice, which kube-proxy's per-connection
NAT does not give). Only addresses on this host are ever used: loopback, and pod addresses routed to one
of the local cluster's node bridges inside Preheat's own network namespace (scripts/netns.sh), which has
no way out; anything else is refused, so a misconfigured kubeconfig cannot make the load generator send
traffic off this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class EndpointSource(Protocol):
    """Anything that can say which `host:port` addresses are ready to take requests now."""

    def ready(self) -> list[str]: ...


NODE_BRIDGE_PREFIX = "phbr"  # the local cluster's node bridges (preheat_cluster.realnode.NodePlan.bridge)
_route_cache: dict[str, str] = {}


def _route_dev(ip: str) -> str:
    """The device the kernel routes `ip` through ('' when it cannot say)."""
    if ip not in _route_cache:
        try:
            out = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        words = out.split()
        _route_cache[ip] = words[words.index("dev") + 1] if "dev" in words[:-1] else ""
    return _route_cache[ip]


def _on_a_node_bridge(ip: str) -> bool:
    """A pod of the local cluster: routed to a node bridge, inside Preheat's network namespace."""
    return bool(os.environ.get("PREHEAT_NETNS")) and _route_dev(ip).startswith(NODE_BRIDGE_PREFIX)


def check_loopback(address: str) -> str:
    """Return `address` (`host:port`) if its host is on this host: a loopback IP, or a pod of the local
    cluster (routed to one of its node bridges inside Preheat's network namespace); else raise ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError as e:
        raise ValueError(f"address {address!r}: host must be a literal IP, got {host!r}") from e
    if ip.is_loopback:
        return address
    if ip.version == 4 and _on_a_node_bridge(str(ip)):
        return address
    raise ValueError(
        f"address {address!r} is not local: the load generator only targets 127.0.0.0/8 and the local "
        "cluster's pods (routed to a node bridge inside Preheat's network namespace)"
    )


class StaticEndpoints:
    """A fixed list of addresses (a server started by hand, or a test server)."""

    def __init__(self, addresses: Iterable[str]):
        self._addresses = [check_loopback(a) for a in addresses]
        if not self._addresses:
            raise ValueError("at least one address is needed")

    def ready(self) -> list[str]:
        return list(self._addresses)


def ready_addresses_from_slices(slices: Iterable[Any], port_name: str | None = None) -> list[str]:
    """Ready `ip:port` addresses in EndpointSlice objects (kubernetes client models or dicts).

    `conditions.ready` unset counts as ready, as the EndpointSlice API defines; terminating
    endpoints are never ready. The port is the one named `port_name`, else the slice's first port.
    """
    out: list[str] = []
    for s in slices:
        d = s if isinstance(s, dict) else s.to_dict()
        ports = d.get("ports") or []
        port = None
        for p in ports:
            if port_name is None or p.get("name") == port_name:
                port = p.get("port")
                break
        if port is None:
            continue
        for ep in d.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            for ip in ep.get("addresses") or []:
                addr = f"{ip}:{port}"
                try:
                    out.append(check_loopback(addr))
                except ValueError as e:
                    log.warning("skipping endpoint: %s", e)
    return sorted(set(out))


def ready_addresses_from_pods(service: Any, pods: Iterable[Any], port_name: str | None = None) -> list[str]:
    """What the EndpointSlice controller would publish for `service`: Ready, not terminating pods
    matching its selector, at the Service's target port (a named port resolved per pod).

    Used when the Service's EndpointSlices hold no addresses although pods match: the real API
    server refuses loopback addresses in EndpointSlices (`may not be in the loopback range`), and
    every pod of the local cluster has a 127.x.y.z address.
    """
    svc = service if isinstance(service, dict) else service.to_dict()
    selector = (svc.get("spec") or {}).get("selector") or {}
    ports = (svc.get("spec") or {}).get("ports") or []
    sport = next((p for p in ports if port_name is None or p.get("name") == port_name), None)
    if not selector or sport is None:
        return []
    target = sport.get("target_port", sport.get("targetPort")) or sport.get("port")
    out: list[str] = []
    for pod in pods:
        d = pod if isinstance(pod, dict) else pod.to_dict()
        meta, status, spec = d.get("metadata") or {}, d.get("status") or {}, d.get("spec") or {}
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        if meta.get("deletion_timestamp", meta.get("deletionTimestamp")) is not None:
            continue
        conds = status.get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
            continue
        ip = status.get("pod_ip", status.get("podIP"))
        port = target
        if isinstance(target, str) and not target.isdigit():
            port = next((cp.get("container_port", cp.get("containerPort"))
                         for c in spec.get("containers") or [] for cp in c.get("ports") or []
                         if cp.get("name") == target), None)
        if not ip or port is None:
            continue
        try:
            out.append(check_loopback(f"{ip}:{int(port)}"))
        except ValueError as e:
            log.warning("skipping pod: %s", e)
    return sorted(set(out))


class EndpointSliceWatcher:
    """Keeps the ready addresses of Service `service` in `namespace` fresh by listing every second.

    Reads the Service's EndpointSlices; when they list no ready address, falls back to the same
    rule the EndpointSlice controller applies (Service selector + pod readiness; see
    `ready_addresses_from_pods`), because the local cluster's loopback pod IPs cannot be stored in
    EndpointSlices. `source` says which was used last. A list each second (not a watch) keeps the
    code obvious and bounds staleness to one second; a failing API server leaves the last known
    list in place and is logged, never raised into the replay.
    """

    def __init__(
        self,
        kubeconfig: str | Path | None,
        namespace: str,
        service: str,
        *,
        port_name: str | None = None,
        interval_s: float = 1.0,
        api_client: Any = None,
    ):
        from kubernetes import client, config

        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.interval_s = interval_s
        self._owns_client = api_client is None  # close only a client we made
        self._api_client = api_client or config.new_client_from_config(
            config_file=str(kubeconfig) if kubeconfig else None
        )
        self._api = client.DiscoveryV1Api(self._api_client)
        self._core = client.CoreV1Api(self._api_client)
        self.source = "EndpointSlice"
        self._ready: list[str] = []
        self._task: asyncio.Task | None = None
        self.refreshes = 0
        self.errors = 0

    def ready(self) -> list[str]:
        return list(self._ready)

    def refresh(self) -> list[str]:
        """One synchronous list of the Service's slices; returns the ready addresses."""
        res = self._api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}", _request_timeout=5
        )
        ready = ready_addresses_from_slices(res.items, self.port_name)
        self.source = "EndpointSlice"
        if not ready:
            svc = self._core.read_namespaced_service(self.service, self.namespace, _request_timeout=5)
            selector = ",".join(f"{k}={v}" for k, v in sorted((svc.spec.selector or {}).items()))
            if selector:
                pods = self._core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=5)
                ready = ready_addresses_from_pods(svc, pods.items, self.port_name)
                self.source = "Service selector"
        self._ready = ready
        self.refreshes += 1
        return self.ready()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.refresh)
            except Exception as e:  # the API server may be restarting; keep the last list
                self.errors += 1
                log.warning("EndpointSlice list for %s/%s failed: %s", self.namespace, self.service, e)
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> EndpointSliceWatcher:
        try:
            await asyncio.to_thread(self.refresh)
        except Exception as e:
            self.errors += 1
            log.warning("first EndpointSlice list failed: %s", e)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._owns_client:
            self._api_client.close()
