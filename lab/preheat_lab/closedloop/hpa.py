"""The `hpa` mode of the closed loop: the real Kubernetes HPA scales the same endpoint.

The InferenceEndpoint is the other modes' with `scaling.mode: Preview` (the operator's own switch for
"the Deployment's replicas belong to the autoscaler you run today": it creates the Deployment, Service
and PDB, keeps every Ready pod serving, writes status, and never touches replicas) and no warm pool.
kube-controller-manager's HPA scales the Deployment on the model server's request rate per pod, read
from Prometheus through prometheus-adapter (preheat_cluster.peers: `request_rate_rules`), configured
as the HPA walkthrough writes a per-pod rate: an `autoscaling/v2` Pods metric with an AverageValue
target equal to the rate per replica Preheat's policy sizes for (the endpoint's `targetPerReplica` at
the policy's target utilization), the endpoint's min/max replicas, and everything
else the HPA's defaults (15 s sync, 10 % tolerance, scale up by max(100 %, 4 pods) per 15 s, scale
down after a 300 s stabilization window). Pure except `create`/`delete`/`rescale_events`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# prometheus-adapter's name for preheat:requests_received_total (`<x>_total` -> `<x>_per_second`)
METRIC = "preheat:requests_received_per_second"
SERIES = "preheat:requests_received_total"


def quantity(value: float) -> str:
    """A per-replica rate as a Kubernetes quantity, exact to a milli-unit ("1500m")."""
    milli = round(value * 1000)
    if milli <= 0:
        raise ValueError(f"an HPA target must be > 0, got {value!r}")
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def hpa_manifest(name: str, deployment: str, target_per_replica: float, min_replicas: int,
                 max_replicas: int) -> dict:
    """autoscaling/v2 HPA on the model server's per-pod request rate; no `behavior`: the defaults."""
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": {"preheat.dev/experiment": "closedloop-hpa"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "minReplicas": min_replicas, "maxReplicas": max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": METRIC},
                "target": {"type": "AverageValue", "averageValue": quantity(target_per_replica)}}}],
        },
    }


def adapter_rules(window: str) -> dict:
    """prometheus-adapter's rules for the HPA's metric: its walkthrough's per-pod rate of the model
    server's request counter, over `window` (the closed loop passes the window Preheat's own rate
    query reads, so both see the same signal; the walkthrough writes 2m, which a 120 s compressed
    replay would never let catch up)."""
    from preheat_cluster.peers import request_rate_rules

    return request_rate_rules(SERIES, window)


_NEW_SIZE = re.compile(r"New size: (?P<to>\d+); reason: (?P<why>.*)")


def rescale_decisions(events: Sequence[dict], start_replicas: int, reason: str = "hpa") -> list[dict]:
    """The HPA's `SuccessfulRescale` Events ("New size: 3; reason: pods metric … above target") as
    decisions in the shape the operator's status.lastDecision takes (t_s, from/to, servingFrom/To,
    `reason`: the autoscaler's name): every replica of the scaled Deployment serves (Preview mode).
    KEDA's HPA writes the same Events, and AIBrix's PodAutoscaler the same message. Sorted by time."""
    out: list[dict] = []
    current = start_replicas
    for e in sorted((e for e in events if e.get("reason") == "SuccessfulRescale" and e.get("t_s") is not None),
                    key=lambda e: e["t_s"]):
        m = _NEW_SIZE.search(e.get("message") or "")
        if not m:
            continue
        to = int(m.group("to"))
        out.append({"t_s": float(e["t_s"]), "from": current, "to": to, "servingFrom": current, "servingTo": to,
                    "reason": reason, "detail": m.group("why"), "count": e.get("count") or 1})
        current = to
    return out


def create(api: Any, namespace: str, body: dict) -> None:
    from kubernetes import client

    client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(namespace, body)


def delete(api: Any, namespace: str, name: str) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.AutoscalingV2Api(api).delete_namespaced_horizontal_pod_autoscaler(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise


def read_status(api: Any, namespace: str, name: str) -> dict:
    """The HPA's status as JSON (current/desired replicas, current metrics, conditions)."""
    from kubernetes import client

    obj = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(name, namespace)
    return api.sanitize_for_serialization(obj.status) or {}


def rescale_events(core: Any, namespace: str, name: str, t0_wall: float,
                   kind: str = "HorizontalPodAutoscaler") -> list[dict]:
    """The Events of the autoscaler object `kind`/`name`, on the experiment clock. A repeated message is
    one Event with a count: its first occurrence is the time a replica count was first ordered."""
    items = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}").items
    out = []
    for e in items:
        when = e.first_timestamp or e.event_time or e.last_timestamp
        if when is not None:
            out.append({"t_s": when.timestamp() - t0_wall, "reason": e.reason, "message": e.message,
                        "count": e.count or 1})
    return sorted(out, key=lambda e: e["t_s"])
