"""The `aibrix` mode of the closed loop: an AIBrix PodAutoscaler (KPA) scales the same endpoint.

The InferenceEndpoint is hpa mode's (`scaling.mode: Preview`, no warm pool). Beside it, a PodAutoscaler
on the endpoint's Deployment as AIBrix's metric-based autoscaling docs recommend
(samples/autoscaling/kpa.yaml): `scalingStrategy: KPA` on a vLLM metric the controller scrapes from
each pod itself (`metricSourceType: pod`, port 8000, path `metrics`; no Prometheus, no aggregator), the
endpoint's min/max replicas, and everything else AIBrix's default (180 s stable and 60 s panic windows,
panic threshold 2, 10 % tolerances, max scale-up rate 2x per decision, 300 s scale-down cooldown,
10 s reconcile). The sample's `gpu_cache_usage_perc` means nothing for a CPU model with short prompts;
the model server exports `vllm:num_requests_running`, the concurrency a Knative-style KPA is built on.

Its target, in that metric's units, is the same per-replica capacity the other modes get (the rate
Preheat's policy sizes for, 1.2 req/s in the demo) converted by Little's law: requests running on a
replica = the rate it serves x the time a request spends in it, so `running_target = per_replica_rps x
request_s`, with `request_s` measured as a platform team sets a concurrency target: one replica
load-tested at its per-replica rate (DEFAULT_REQUEST_S; `LoopConfig.aibrix_request_s` overrides it).
KPA sums the metric over pods and divides by the target, so at that target it asks for as many
replicas as the request rate / 1.2 would. The run's own mean request time is recorded beside it, not
used: on two shared cores it grows with the replica count and with overload, so it measures the
machine more than a replica.
The mode's decisions are the PodAutoscaler's `SuccessfulRescale` Events ("New size: 2; reason: panic
mode scaling"), in the HPA's format. Pure except `create`/`delete`/`read_status`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .custom_objects import CustomObjects

GROUP, VERSION, PLURAL, KIND = "autoscaling.aibrix.ai", "v1alpha1", "podautoscalers", "PodAutoscaler"
METRIC = "num_requests_running"  # AIBrix's name for vllm:num_requests_running
# Fallback for `request_s` when no earlier mode of the run measured it: the mean send -> answer time
# when one tiny-model replica (max 2 sequences) served 1.2 req/s of the closed loop's requests on the
# 2-core development machine at load ~1 (2026-12-04: 72 requests, mean 0.134 s, median 0.027 s; the
# server's own vllm:e2e_request_latency_seconds mean 0.130 s). The mean, not the median: Little's law.
DEFAULT_REQUEST_S = 0.13


def running_target(per_replica_rps: float, request_s: float) -> float:
    """Requests running per replica at the per-replica rate (Little's law: L = lambda x W)."""
    if per_replica_rps <= 0 or request_s <= 0:
        raise ValueError(f"rate and request time must be > 0, got {per_replica_rps!r}, {request_s!r}")
    return per_replica_rps * request_s


def request_seconds(results: Sequence[dict]) -> tuple[float, int] | None:
    """The mean send -> answer time over the requests the given modes' runs served (their
    `request_s_mean`, weighted by `request_s_count`), and how many requests it is over; None if none."""
    n = sum(int(r.get("request_s_count") or 0) for r in results)
    if not n:
        return None
    total = sum(float(r["request_s_mean"]) * int(r["request_s_count"]) for r in results if r.get("request_s_count"))
    return total / n, n


def pod_autoscaler(deployment: str, *, target_running: float, min_replicas: int, max_replicas: int,
                   port: int) -> dict:
    """The PodAutoscaler of aibrix mode (named as its Deployment, as AIBrix's docs ask), scraping the
    model server's /metrics on its `port`."""
    from preheat_cluster.peers_aibrix import pod_autoscaler as upstream_shape

    body = upstream_shape(deployment, metric=METRIC, target=f"{target_running:.4g}", strategy="KPA",
                          min_replicas=min_replicas, max_replicas=max_replicas, port=port)
    body["metadata"]["labels"] = {"preheat.dev/experiment": "closedloop-aibrix"}
    return body


_OBJECTS = CustomObjects(GROUP, VERSION, PLURAL)
create = _OBJECTS.create
delete = _OBJECTS.delete
read_status = _OBJECTS.read_status  # the PodAutoscaler's status (actual/desired scale, conditions, scaling history)
