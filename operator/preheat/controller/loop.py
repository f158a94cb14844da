"""One autoscaling step of one endpoint: collect -> step -> scale (as Knative's autoscaler keeps them).

- collect (`collect.py`): the Deployment's replicas, the pods and the signal from Prometheus, read once;
- step (`step.py`, pure): the endpoint's Autoscaler decides, `actuation.plan` turns the decision into
  promotions, demotions and replicas, and the status and Events say what happened and why;
- scale (`scale.py`): the pod patches, the Deployment's replicas, the status.

Blocking (the kubernetes client is synchronous); the Kopf daemon runs it in a worker thread. It returns
the Events to post and how long to sleep, so the async side stays a thin loop. Everything it decides
comes from the cluster as it is now (pods, Deployment) plus the endpoint's state (`endpoint.Endpoint`),
so a restarted operator picks up where the last one stopped without double promotions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from preheat.controller import metrics
from preheat.controller import status as st
from preheat.controller.collect import collect, history
from preheat.controller.endpoint import Endpoint
from preheat.controller.observe import PrometheusSource
from preheat.controller.scale import route, scale, write_status
from preheat.controller.spec import InferenceEndpointSpec
from preheat.controller.step import EventNote, StepContext, step
from preheat.scaling.from_spec import policy_config, seed
from preheat.scaling.policy.types import Decision, Reason

log = logging.getLogger("preheat.loop")

# Any new value of this annotation makes the operator drop the endpoint's forecaster and rebuild it
# from the signal's history in Prometheus (after a backfill or restore of Prometheus, or when an
# outage scarred the learned profile). The value handled last is kept in status.forecasterRebuild.
REBUILD_ANNOTATION = "preheat.dev/rebuild-forecaster"


@dataclass
class Options:
    prometheus_url: str = "http://127.0.0.1:9090"
    reactive_only: bool = False
    # Tests and the demo shorten the loop; in production the spec's intervalSeconds (15 s) rules.
    interval_override_s: float | None = None
    # Who acts (the Kopf peering identity): written into .status.operator on every step, so two
    # replicas of the operator can be told apart in what they write.
    identity: str = ""
    # The image the activator pods of scale-to-zero endpoints run (`preheat activator`): the operator's own.
    activator_image: str | None = None


@dataclass
class StepResult:
    events: list[EventNote]
    sleep_s: float
    decision: Decision | None = None


class Controller:
    """Every endpoint this operator handles (one `Endpoint` each) and the Prometheus sources they read."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.endpoints: dict[tuple[str, str], Endpoint] = {}
        self._sources: dict[str, PrometheusSource] = {}

    def source(self, spec: InferenceEndpointSpec) -> PrometheusSource:
        url = spec.prometheus.url or self.options.prometheus_url
        if url not in self._sources:
            self._sources[url] = PrometheusSource(url)
        return self._sources[url]

    def forget(self, namespace: str, name: str) -> None:
        self.endpoints.pop((namespace, name), None)
        metrics.forget(namespace, name)

    def interval(self, spec: InferenceEndpointSpec) -> float:
        return self.options.interval_override_s or spec.scaling.interval_seconds

    def step(self, body: dict[str, Any], spec: InferenceEndpointSpec) -> StepResult:
        """One step of an endpoint whose spec the handler parsed (handlers._parsed: the one parse and
        the one InvalidSpec path); the handler counts and times the step."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        ep = self.endpoints.setdefault((namespace, name), Endpoint())
        events, rebuild = self._prepare(ep, body, spec)
        seen = collect(namespace, name, spec, self.source(spec))
        if seen is None:  # no Deployment yet: the reconcile handler creates it
            return StepResult([], min(self.interval(spec), 5.0))
        ctx = StepContext(name, meta.get("generation"), body.get("status") or {}, st.now_iso(), self.interval(spec),
                          self.options.reactive_only, self.options.identity, rebuild)
        out = step(ep, spec, seen, ctx)
        metrics.record_decision(namespace, name, out)
        to_activator, selector = out.to_activator, seen.activator.selector if seen.activator else None
        if to_activator:  # the activator takes the requests before the last serving pod leaves
            events += self._route(namespace, name, True, selector)
        scale(namespace, name, out.applied)
        if to_activator is False:  # and gives them back once the promoted pod serves
            events += self._route(namespace, name, False, selector)
        if out.plan.shortfall and out.decision.reason is not Reason.HOLD:
            log.info("%s/%s: %d serving replica(s) wait for warm pods to load", namespace, name, out.plan.shortfall)
        write_status(namespace, name, out.status)
        metrics.record_step(namespace, name, spec.scaling.target_per_replica, seen, out)
        return StepResult(events + out.events, out.sleep_s, out.decision)

    @staticmethod
    def _route(namespace: str, name: str, to_activator: bool, selector: dict[str, str] | None) -> list[EventNote]:
        message = route(namespace, name, to_activator, selector)
        return [EventNote("Normal", "Routed", message)] if message else []

    def _prepare(self, ep: Endpoint, body: dict[str, Any],
                 spec: InferenceEndpointSpec) -> tuple[list[EventNote], dict[str, Any] | None]:
        """The endpoint's autoscaler for this spec: kept, restored from status, or rebuilt (on a new
        REBUILD_ANNOTATION value) and seeded from Prometheus. Returns the Events and, when a rebuild was
        handled, the status.forecasterRebuild to write."""
        meta, previous = body["metadata"], body.get("status") or {}
        request = (meta.get("annotations") or {}).get(REBUILD_ANNOTATION)
        if ep.rebuild_handled is None:
            ep.rebuild_handled = (previous.get("forecasterRebuild") or {}).get("request")
        rebuilding = bool(request) and request != ep.rebuild_handled
        if rebuilding:  # asked to forget what was learned
            ep.forget_forecaster()
        config = policy_config(spec, self.options.reactive_only, self.options.interval_override_s)
        where = f"{meta['namespace']}/{meta['name']}"
        ep.autoscaler_for(spec, config, None if rebuilding else previous.get("forecaster"), where)
        events = []
        if not ep.history_seeded:
            n = self._seed(ep, meta["namespace"], meta["name"], spec)
            if n or rebuilding:
                events.append(EventNote(
                    "Normal", "ForecasterSeeded",
                    f"replayed {n} samples ({ep.seeded.get('spanSeconds', 0):.0f} s) of the signal's history from "
                    "Prometheus into the forecaster" + (f" (rebuild requested: {request})" if rebuilding else "")))
        if not rebuilding:
            return events, None
        ep.rebuild_handled = request
        ep.last_persist_s = 0.0  # persist the rebuilt state with this step's status
        return events, {"request": request, **ep.seeded}

    def _seed(self, ep: Endpoint, namespace: str, name: str, spec: InferenceEndpointSpec) -> int:
        """Replay the signal's recent history from Prometheus into a new forecaster."""
        ep.history_seeded = True
        assert ep.autoscaler is not None
        samples = history(namespace, name, spec, self.source(spec), self.interval(spec))
        n = seed(ep.autoscaler, samples)
        span = time.time() - samples[0][0] if samples else 0.0
        ep.seeded = {"samples": n, "spanSeconds": round(span, 1), "time": st.now_iso()}
        if n:
            log.info("seeded %s/%s forecaster with %d samples (%.0f s) from Prometheus", namespace, name, n, span)
        return n
