"""The operator's own Prometheus metrics (names and labels per docs/ARCHITECTURE.md).

One registry, served on --metrics-port by prometheus-client. Per-endpoint series are removed when
the endpoint is deleted so 200 short-lived endpoints do not leave 200 dead series behind.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

if TYPE_CHECKING:
    from preheat.controller.collect import Collected
    from preheat.controller.step import Outcome

REGISTRY = CollectorRegistry(auto_describe=True)
EP = ("namespace", "endpoint")

replicas = Gauge("preheat_endpoint_replicas", "Replica counts by kind.", [*EP, "kind"], registry=REGISTRY)
signal = Gauge("preheat_endpoint_signal", "The scaling signal now.", EP, registry=REGISTRY)
forecast_signal = Gauge(
    "preheat_endpoint_forecast_signal", "Forecast of the signal at now + lead time.", EP, registry=REGISTRY
)
forecast_signal_upper = Gauge(
    "preheat_endpoint_forecast_signal_upper", "Upper-quantile forecast (the safety margin).", EP, registry=REGISTRY
)
# The same three under their v1alpha1 names, exported beside the new ones for one version (dashboards
# and alerts built on them keep working while they move).
DEPRECATED_GAUGES = {
    signal: Gauge("preheat_endpoint_observed_rate", "Deprecated: preheat_endpoint_signal.", EP, registry=REGISTRY),
    forecast_signal: Gauge("preheat_endpoint_forecast_rate", "Deprecated: preheat_endpoint_forecast_signal.", EP,
                           registry=REGISTRY),
    forecast_signal_upper: Gauge("preheat_endpoint_forecast_upper", "Deprecated: preheat_endpoint_forecast_signal_upper.",
                                 EP, registry=REGISTRY),
}
warm_cost_fraction = Gauge(
    "preheat_endpoint_warm_cost_fraction", "A warm replica's cost relative to a serving one.", EP, registry=REGISTRY
)
replica_cost = Gauge(
    "preheat_endpoint_replica_cost", "Serving + warm x warm cost fraction, in serving replicas.", EP, registry=REGISTRY
)
resizes = Counter(
    "preheat_resizes_total", "In-place pod resizes by direction and outcome.", [*EP, "direction", "outcome"],
    registry=REGISTRY,
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

_PER_ENDPOINT = (signal, forecast_signal, forecast_signal_upper, *DEPRECATED_GAUGES.values(), capacity, lead_time, cold_start, metrics_available,
                 forecast_error, promotions, demotions, warm_cost_fraction, replica_cost)
REPLICA_KINDS = ("serving", "warm", "desired", "ready", "starting")


def forget(namespace: str, endpoint: str) -> None:
    """Drop an endpoint's series (it was deleted)."""
    for metric in _PER_ENDPOINT:
        with contextlib.suppress(KeyError):
            metric.remove(namespace, endpoint)
    for kind in REPLICA_KINDS:
        with contextlib.suppress(KeyError):
            replicas.remove(namespace, endpoint, kind)
    for metric in (decisions, scale_actions, resizes):
        # Labelled by a third key we do not enumerate here; remove whatever exists for the endpoint.
        for labels in list(metric._metrics):
            if labels[:2] == (namespace, endpoint):
                metric.remove(*labels)


def record_decision(namespace: str, endpoint: str, outcome: Outcome) -> None:
    """A step decided: count it by reason, and the forecast error it scored."""
    decisions.labels(namespace, endpoint, str(outcome.decision.reason)).inc()
    if outcome.forecast_error is not None:
        forecast_error.labels(namespace, endpoint).set(outcome.forecast_error)


def record_step(namespace: str, endpoint: str, target_per_replica: float, seen: Collected, outcome: Outcome) -> None:
    """A step was applied: the relabels and scale actions it made, and the endpoint's gauges."""
    ep, applied, decision, counts = (namespace, endpoint), outcome.applied, outcome.decision, seen.counts
    if applied.promote:
        promotions.labels(*ep).inc(len(applied.promote))
    if applied.demote:
        demotions.labels(*ep).inc(len(applied.demote))
    if applied.replicas is not None:
        up = seen.replicas is None or applied.replicas > seen.replicas
        scale_actions.labels(*ep, "up" if up else "down").inc()
    for kind, value in (("serving", outcome.serving), ("warm", outcome.warm), ("desired", decision.total),
                        ("ready", counts.ready), ("starting", counts.starting)):
        replicas.labels(*ep, kind).set(value)
    metrics_available.labels(*ep).set(1 if seen.metrics.available else 0)
    for gauge, value in ((signal, seen.metrics.signal if seen.metrics.available else None),
                         (forecast_signal, decision.forecast_value), (forecast_signal_upper, decision.forecast_upper)):
        if value is not None:
            gauge.labels(*ep).set(value)
            DEPRECATED_GAUGES[gauge].labels(*ep).set(value)
    fraction = float(outcome.status.get("warmCostFraction", 1.0))
    warm_cost_fraction.labels(*ep).set(fraction)
    replica_cost.labels(*ep).set(outcome.serving + outcome.warm * fraction)
    capacity.labels(*ep).set(outcome.serving * target_per_replica)
    lead_time.labels(*ep).set(decision.lead_time_s)
    if outcome.cold_start_s is not None:
        cold_start.labels(*ep).set(outcome.cold_start_s)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics in a background thread (prometheus-client's own server)."""
    start_http_server(port, addr=addr, registry=REGISTRY)
