"""Collect: what one step knows of an endpoint, read from the cluster and Prometheus in one place.

The Deployment's replicas, the model-server pods (as `actuation.PodView`s) and the signal, queue and
running batch from Prometheus. The rest of the step (`controller/step.py`) is pure and works on this.
Also the history replay that seeds a new forecaster from Prometheus.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from preheat.controller import actuation, routing
from preheat.controller.builders import selector_labels, selector_string, workload_name
from preheat.controller.kube import shared_api
from preheat.controller.observe import MetricsResult, PrometheusSource, history_query, signal_queries
from preheat.controller.spec import InferenceEndpointSpec

HISTORY_MIN_S = 3600.0  # load seconds (wall seconds / timeCompression)
HISTORY_MAX_S = 7 * 86400.0


@dataclass(frozen=True)
class Collected:
    """One endpoint as this step found it."""

    now_s: float
    replicas: int | None  # the Deployment's spec.replicas
    pods: list[actuation.PodView]
    metrics: MetricsResult
    activator: routing.ActivatorSeen | None = None  # None: no activator (scale to zero off)

    @property
    def counts(self) -> actuation.PodCounts:
        return actuation.count(self.pods)


def collect(namespace: str, name: str, spec: InferenceEndpointSpec, source: PrometheusSource) -> Collected | None:
    """Read the endpoint's Deployment, pods and metrics; None while its Deployment does not exist yet
    (the reconcile handler creates it; there is nothing to scale)."""
    api = shared_api()
    now_s = time.time()
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment(workload_name(name), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    selector = selector_string(selector_labels(name))
    pod_list = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector)
    pods = [actuation.pod_view(api.sanitize_for_serialization(p)) for p in pod_list.items]
    return Collected(now_s, dep.spec.replicas, pods, source.observe(signal_queries(namespace, name, spec)),
                     _activator(api, namespace, name) if routing.uses_activator(spec) else None)


def _activator(api: client.ApiClient, namespace: str, name: str) -> routing.ActivatorSeen:
    """Whether the activator has a Ready pod, and whether the public Service selects it."""
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment(routing.activator_name(name), namespace)
        ready = bool(dep.status and dep.status.ready_replicas)
    except ApiException as exc:
        if exc.status != 404:
            raise
        ready = False
    svc = client.CoreV1Api(api).read_namespaced_service(workload_name(name), namespace)
    selector = dict(svc.spec.selector or {})
    return routing.ActivatorSeen(ready, selector == routing.activator_selector(name), selector)


def history(namespace: str, name: str, spec: InferenceEndpointSpec, source: PrometheusSource,
            interval_s: float) -> list[tuple[float, float]]:
    """The signal's recent history, to seed a new forecaster so a restart keeps the seasonality.

    Two seasons (at least an hour, at most a week) of the load's clock: with timeCompression the
    same span in wall seconds is that many times shorter."""
    f = spec.scaling.forecasting
    season = f.seasonality_seconds or 86400.0
    span = min(max(HISTORY_MIN_S, 2.0 * season), HISTORY_MAX_S) / f.time_compression
    step = max(interval_s, span / 10_000)  # Prometheus answers at most 11k points
    end = time.time()
    return source.history(history_query(namespace, name, spec), end - span, end, step)

