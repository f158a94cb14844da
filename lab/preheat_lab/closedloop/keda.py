"""The `keda` mode of the closed loop: a KEDA ScaledObject scales the same endpoint.

The InferenceEndpoint is hpa mode's (`scaling.mode: Preview`, no warm pool: the operator creates the
Deployment, keeps every Ready pod serving and never touches replicas). Beside it, a ScaledObject on the
endpoint's Deployment, as KEDA's Prometheus scaler docs write one for a request rate: one `prometheus`
trigger with `serverAddress` (the cluster's Prometheus), `query` = the very rate Preheat's operator
reads for this endpoint (`preheat.controller.observe.default_queries(...)["rate"]`, the endpoint's
total arrivals/s over its stable window) and `threshold` = the rate per replica Preheat's policy sizes
for (KEDA's default metric type AverageValue divides the query's value by the replica count, so the
threshold is a per-replica target, like the hpa mode's 1200m), the endpoint's min/max replicas, and
everything else KEDA's default: 30 s `pollingInterval` (KEDA's own loop; it activates/deactivates the
target and feeds the metrics cache), 300 s `cooldownPeriod` (only for scaling to zero, which
minReplicas 1 rules out), and the HPA KEDA creates (`keda-hpa-<name>`) with the HPA's defaults (15 s
sync, 300 s scale-down stabilization). The mode's decisions are that HPA's `SuccessfulRescale` Events.
Pure except `create`/`delete`/`read_status`.
"""

from __future__ import annotations

from .custom_objects import CustomObjects

GROUP, VERSION, PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
METRIC = "s0-prometheus"  # the external metric KEDA names for the first (prometheus) trigger


def threshold(value: float) -> str:
    """A per-replica rate as KEDA's threshold string (a decimal; KEDA parses it as a quantity)."""
    if value <= 0:
        raise ValueError(f"a KEDA threshold must be > 0, got {value!r}")
    return f"{value:.6g}"


def scaled_object(deployment: str, *, query: str, per_replica: float, server_address: str,
                  min_replicas: int, max_replicas: int) -> dict:
    """The ScaledObject of keda mode (named as its Deployment); KEDA's defaults beyond the trigger."""
    from preheat_cluster.peers_keda import scaled_object as upstream_shape

    body = upstream_shape(deployment, query=query, threshold=threshold(per_replica), server_address=server_address,
                          min_replicas=min_replicas, max_replicas=max_replicas)
    body["metadata"]["labels"] = {"preheat.dev/experiment": "closedloop-keda"}
    return body


def hpa_name(scaled_object_name: str) -> str:
    """The HPA keda-operator creates for a ScaledObject (its default name)."""
    return f"keda-hpa-{scaled_object_name}"


_OBJECTS = CustomObjects(GROUP, VERSION, PLURAL)
create = _OBJECTS.create
delete = _OBJECTS.delete
read_status = _OBJECTS.read_status  # the ScaledObject's status (conditions, external metric names, the HPA it made)
