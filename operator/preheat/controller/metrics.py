"""The operator's own Prometheus metrics (names and labels per docs/ARCHITECTURE.md).

One registry, served on --metrics-port by prometheus-client. Per-endpoint series are removed when
the endpoint is deleted so 200 short-lived endpoints do not leave 200 dead series behind.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)
EP = ("namespace", "endpoint")

replicas = Gauge("preheat_endpoint_replicas", "Replica counts by kind.", [*EP, "kind"], registry=REGISTRY)
observed_rate = Gauge("preheat_endpoint_observed_rate", "The scaling signal now.", EP, registry=REGISTRY)
forecast_rate = Gauge(
    "preheat_endpoint_forecast_rate", "Forecast of the signal at now + lead time.", EP, registry=REGISTRY
)
forecast_upper = Gauge(
    "preheat_endpoint_forecast_upper", "Upper-quantile forecast (the safety margin).", EP, registry=REGISTRY
)
capacity = Gauge("preheat_endpoint_capacity", "Serving replicas x per-replica target.", EP, registry=REGISTRY)
lead_time = Gauge(
    "preheat_endpoint_lead_time_seconds", "Cold start p90 + decision interval.", EP, registry=REGISTRY
)
cold_start = Gauge("preheat_endpoint_cold_start_seconds", "p90 pod creation -> Ready.", EP, registry=REGISTRY)
metrics_available = Gauge(
    "preheat_endpoint_metrics_available", "1 when Prometheus answered with data.", EP, registry=REGISTRY
)
forecast_error = Gauge(
    "preheat_endpoint_forecast_error_ratio",
    "|forecast - actual| / actual for the forecast made one lead time ago.",
    EP,
    registry=REGISTRY,
)
decisions = Counter("preheat_decisions_total", "Decisions by the term that won.", [*EP, "reason"], registry=REGISTRY)
scale_actions = Counter(
    "preheat_scale_actions_total", "Applied changes of desired replicas.", [*EP, "direction"], registry=REGISTRY
)
promotions = Counter("preheat_promotions_total", "Warm -> serving relabels.", EP, registry=REGISTRY)
demotions = Counter("preheat_demotions_total", "Serving -> warm relabels.", EP, registry=REGISTRY)
# Two kinds of work, counted apart: a reconcile (create/update/resume: the Deployment, Service and
# PDB brought to their built form) and an autoscale step (one pass of an endpoint's loop).
reconciles = Counter("preheat_reconcile_total", "Reconciles by outcome.", ["outcome"], registry=REGISTRY)
reconcile_duration = Histogram(
    "preheat_reconcile_duration_seconds",
    "Reconcile duration (create/update/resume).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
autoscale_steps = Counter(
    "preheat_autoscale_steps_total", "Autoscale steps by outcome.", ["outcome"], registry=REGISTRY
)
autoscale_step_duration = Histogram(
    "preheat_autoscale_step_duration_seconds",
    "Autoscale step duration (observe, decide, actuate, write status).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)

_PER_ENDPOINT = (observed_rate, forecast_rate, forecast_upper, capacity, lead_time, cold_start, metrics_available,
                 forecast_error, promotions, demotions)
REPLICA_KINDS = ("serving", "warm", "desired", "ready", "starting")


def forget(namespace: str, endpoint: str) -> None:
    """Drop an endpoint's series (it was deleted)."""
    for metric in _PER_ENDPOINT:
        with contextlib.suppress(KeyError):
            metric.remove(namespace, endpoint)
    for kind in REPLICA_KINDS:
        with contextlib.suppress(KeyError):
            replicas.remove(namespace, endpoint, kind)
    for metric in (decisions, scale_actions):
        # Labelled by a third key we do not enumerate here; remove whatever exists for the endpoint.
        for labels in list(metric._metrics):
            if labels[:2] == (namespace, endpoint):
                metric.remove(*labels)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics in a background thread (prometheus-client's own server)."""
    start_http_server(port, addr=addr, registry=REGISTRY)
