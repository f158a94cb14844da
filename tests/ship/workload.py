"""A small real workload for the dashboard test, and PromQL helpers.

Requests go to the serving pods' addresses from the endpoint's EndpointSlices, as a client of a
cluster without kube-proxy would. On the local cluster those are pod addresses behind the real nodes'
bridges, inside the test's network namespace, and are called directly;
on a cluster whose pod IPs the test host cannot reach (kind: PREHEAT_POD_NETWORK=proxy) requests go
through the API server's pod proxy. Nothing is ever sent directly to an address off this host.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
import urllib.parse
import urllib.request
from typing import Any

from preheat_cluster.realnode import POD_CIDR

from .tools import Kube


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable syntax ($name, ${name}) replaced by values; longest names first."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def dashboard_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every panel target's expression, keyed 'panel title / refId' (rows included, recursively)."""
    out: dict[str, str] = {}

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                out[f"{p['title']} / {t['refId']}"] = t["expr"]
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    return out


def prometheus_query_range(
    url: str, promql: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    qs = urllib.parse.urlencode(
        {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{qs}", timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


def serving_addresses(kube: Kube, namespace: str, service: str) -> list[tuple[str, str, int]]:
    """(pod name, ip, port) of ready endpoints in the Service's EndpointSlices."""
    slices = kube.get_json("endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}")
    out = []
    for s in slices["items"]:
        port = next((p["port"] for p in s.get("ports") or [] if p.get("name") == "http"), None)
        for ep in s.get("endpoints") or []:
            if port is None or ep.get("conditions", {}).get("ready") is False:
                continue
            pod = (ep.get("targetRef") or {}).get("name", "")
            out += [(pod, ip, port) for ip in ep["addresses"]]
    return out


# The local cluster's pod range: its nodes' bridges live in the same network namespace as the tests.
LOCAL_POD_RANGES = (ipaddress.ip_network(POD_CIDR),)


def is_host_local(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return addr.is_loopback or any(addr in r for r in LOCAL_POD_RANGES)


def _post(kube: Kube, handle: Any, namespace: str, pod: str, ip: str, port: int, body: dict[str, Any]) -> int:
    data = json.dumps(body).encode()
    if os.environ.get("PREHEAT_POD_NETWORK") == "proxy":
        proc = kube.kubectl(
            "create",
            "--raw",
            f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/v1/completions",
            "-f",
            "-",
            input=data.decode(),
            check=False,
            timeout=60,
        )
        return 200 if proc.returncode == 0 else 500
    if not is_host_local(ip):
        raise AssertionError(
            f"pod IP {ip} is not on this host: set PREHEAT_POD_NETWORK=proxy for this cluster"
        )
    req = urllib.request.Request(
        f"http://{ip}:{port}/v1/completions", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def send_requests(
    kube: Kube, handle: Any, namespace: str, endpoint: str, *, seconds: float, max_requests: int = 400
) -> dict[str, int]:
    """Send completions round-robin over the serving pods for about `seconds` (bounded in count too)."""
    counts = {"ok": 0, "failed": 0}
    deadline = time.monotonic() + seconds
    i = 0
    addrs: list[tuple[str, str, int]] = []
    while time.monotonic() < deadline and i < max_requests:
        if i % 20 == 0 or not addrs:
            # Re-read now and then: the operator promotes and demotes pods while this runs.
            addrs = serving_addresses(kube, namespace, endpoint)
        if not addrs:
            time.sleep(0.5)
            continue
        pod, ip, port = addrs[i % len(addrs)]
        # Every third prompt shares a long prefix with the others: prefix-cache hits on the server.
        prompt = "the warm pool keeps loaded replicas ready for the next scale up " * 3 if i % 3 == 0 else ""
        prompt += f"request {i} of the ship test"
        status = _post(
            kube,
            handle,
            namespace,
            pod,
            ip,
            port,
            {"model": endpoint, "prompt": prompt, "max_tokens": 8, "temperature": 0},
        )
        counts["ok" if status == 200 else "failed"] += 1
        i += 1
    return counts
