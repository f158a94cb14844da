"""One autoscaling step for one endpoint: observe -> forecast/policy -> actuate -> status.

Blocking (the kubernetes client is synchronous); the Kopf daemon runs it in a worker thread. It
returns the Events to post and how long to sleep, so the async side stays a thin loop. Everything
it decides comes from the cluster as it is now (pods, Deployment) plus the brain's memory, so a
restarted operator picks up where the last one stopped without double promotions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from preheat.controller import actuation, metrics
from preheat.controller import status as st
from preheat.controller.brain import Brain, forecasting_key, policy_config
from preheat.controller.builders import selector_labels, selector_string, serving_selector, workload_name
from preheat.controller.kube import shared_api
from preheat.controller.observe import MetricsResult, PrometheusSource, history_query, signal_queries
from preheat.controller.spec import (
    GROUP,
    PLURAL,
    VERSION,
    InferenceEndpointSpec,
    Mode,
)
from preheat.scaling.policy.decide import clean_cold_starts, cold_start_s
from preheat.scaling.policy.types import Decision, Observation, PolicyConfig, Reason

log = logging.getLogger("preheat.loop")

COLD_START_WINDOW = 50  # pods whose creation -> Ready time feeds the p90
PERSIST_EVERY_S = 60.0  # how often the forecaster's state goes into .status (it is rebuilt anyway)
MAX_PERSIST_BYTES = 100_000
MAX_BACKOFF_FACTOR = 4  # metrics failures stretch the interval up to 4x, never more
HISTORY_MIN_S = 3600.0  # load seconds (wall seconds / timeCompression)
HISTORY_MAX_S = 7 * 86400.0
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


@dataclass
class Memory:
    """What the operator keeps per endpoint between steps (all rebuildable from the cluster)."""

    brain: Brain | None = None
    config: PolicyConfig | None = None
    signal: str | None = None
    cold_starts: dict[str, float] = field(default_factory=dict)
    metrics_failures: int = 0
    forecasts: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=512))
    last_persist_s: float = 0.0
    last_failure_event: str = ""
    last_reason: str = ""
    history_seeded: bool = False
    rebuild_handled: str | None = None
    seeded: dict[str, Any] = field(default_factory=dict)


@dataclass
class EventNote:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class StepResult:
    events: list[EventNote]
    sleep_s: float
    decision: Decision | None = None


def _iso_to_api(pod: Any) -> dict[str, Any]:
    """The kubernetes client's model object -> the API's own camelCase dict."""
    return shared_api().sanitize_for_serialization(pod)


def retry_conflict(fn: Any, attempts: int = 5) -> Any:
    """Run fn(); on 409 Conflict try again (someone else wrote first: re-read happens inside fn)."""
    for i in range(attempts):
        try:
            return fn()
        except ApiException as exc:
            if exc.status != 409 or i == attempts - 1:
                raise
            time.sleep(0.05 * (2**i))
    return None


def observation(now_s: float, counts: actuation.PodCounts, samples: tuple[float, ...],
                observed: MetricsResult) -> Observation:
    """What the policy sees this step. `current_serving` is the Ready pods labelled serving: new pods
    start in the warm pool and are promoted when Ready, so no starting pod is ever labelled serving
    (the simulator reports the same, `ReplicaPool.observed_serving`)."""
    return Observation(
        time_s=now_s,
        value=observed.value if observed.available else None,
        value_panic=observed.value_panic if observed.available else None,
        stale=not observed.available,
        serving_ready=counts.serving_ready,
        warm_ready=counts.warm_ready,
        starting=counts.starting,
        current_serving=counts.serving_ready,
        cold_start_samples_s=samples,
        queue=observed.queue,
        running=observed.running,
    )


def planned_cold_start_s(config: PolicyConfig, samples: tuple[float, ...]) -> float | None:
    """status.coldStartSeconds: the cold start the lead time plans with (the policy's own quantile
    function and quantile), None before any pod was seen Ready."""
    return cold_start_s(config, samples) if clean_cold_starts(samples) else None


class Autoscaling:
    """The loop's logic for every endpoint this operator handles (one Memory per endpoint)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.memory: dict[tuple[str, str], Memory] = {}
        self._sources: dict[str, PrometheusSource] = {}

    # ---- helpers -------------------------------------------------------------------------------
    def source(self, spec: InferenceEndpointSpec) -> PrometheusSource:
        url = spec.prometheus.url or self.options.prometheus_url
        if url not in self._sources:
            self._sources[url] = PrometheusSource(url)
        return self._sources[url]

    def forget(self, namespace: str, name: str) -> None:
        self.memory.pop((namespace, name), None)
        metrics.forget(namespace, name)

    def interval(self, spec: InferenceEndpointSpec) -> float:
        return self.options.interval_override_s or spec.scaling.interval_seconds

    def _brain(self, mem: Memory, namespace: str, name: str, spec: InferenceEndpointSpec,
               saved: str | dict[str, Any] | None) -> Brain:
        config = policy_config(spec, self.options.reactive_only, self.options.interval_override_s)
        signal = str(spec.scaling.signal)
        key = forecasting_key(spec, config.decision_interval_s)
        if mem.brain is not None and mem.config == config and mem.signal == signal and mem.brain.key == key:
            return mem.brain
        if mem.brain is not None and mem.signal == signal and mem.brain.key == key:
            # Spec change: new policy configuration, same forecaster (the signal's history still holds).
            mem.brain = Brain(config, spec, mem.brain.forecaster)
        elif mem.brain is not None:
            # The forecaster's own settings changed (model, season, clock, signal, step): what it learned
            # does not apply; rebuild it from the signal's history in Prometheus.
            log.info("forecasting settings of %s/%s changed: rebuilding the forecaster from Prometheus",
                     namespace, name)
            mem.brain = Brain(config, spec)
            mem.history_seeded = False
        else:
            mem.brain = None
            if saved and mem.signal is None:
                try:
                    mem.brain = Brain.from_dict(json.loads(saved) if isinstance(saved, str) else saved, config, spec)
                    mem.history_seeded = True
                    log.info("restored forecaster state for %s/%s from status", namespace, name)
                except Exception as exc:  # a newer/older format: rebuild from Prometheus instead
                    log.warning("cannot restore forecaster state for %s/%s: %s", namespace, name, exc)
            if mem.brain is None:
                mem.brain = Brain(config, spec)
                mem.history_seeded = False
        mem.config, mem.signal = config, signal
        return mem.brain

    def _seed_history(self, mem: Memory, namespace: str, name: str, spec: InferenceEndpointSpec) -> int:
        """Replay the signal's recent history from Prometheus so a restart keeps the seasonality.

        Two seasons (at least an hour, at most a week) of the load's clock: with timeCompression the
        same span in wall seconds is that many times shorter. Returns the samples replayed."""
        mem.history_seeded = True
        brain = mem.brain
        if brain is None or brain.forecaster is None:
            return 0
        f = spec.scaling.forecasting
        season = f.seasonality_seconds or 86400.0
        span = min(max(HISTORY_MIN_S, 2.0 * season), HISTORY_MAX_S) / f.time_compression
        step = max(self.interval(spec), span / 10_000)  # Prometheus answers at most 11k points
        end = time.time()
        samples = self.source(spec).history(history_query(namespace, name, spec), end - span, end, step)
        n = brain.seed(samples)
        first = samples[0][0] if samples else None
        mem.seeded = {"samples": n, "spanSeconds": round(end - first, 1) if first is not None else 0.0,
                      "time": st.now_iso()}
        if n:
            log.info("seeded %s/%s forecaster with %d samples (%.0f s) from Prometheus", namespace, name, n,
                     end - (first or end))
        return n

    # ---- the step ------------------------------------------------------------------------------
    def step(self, body: dict[str, Any], spec: InferenceEndpointSpec) -> StepResult:
        """One step of an endpoint whose spec the handler parsed (handlers._parsed: the one parse and
        the one InvalidSpec path); the handler counts and times the step."""
        return self._step(body, spec)

    def _step(self, body: dict[str, Any], spec: InferenceEndpointSpec) -> StepResult:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        generation = meta.get("generation")
        previous = body.get("status") or {}
        now_s = time.time()
        now = st.now_iso()
        events: list[EventNote] = []
        mem = self.memory.setdefault((namespace, name), Memory())
        rebuild = (meta.get("annotations") or {}).get(REBUILD_ANNOTATION)
        handled = (previous.get("forecasterRebuild") or {}).get("request")
        if mem.rebuild_handled is None:
            mem.rebuild_handled = handled
        saved = previous.get("forecaster")
        rebuilding = bool(rebuild) and rebuild != mem.rebuild_handled
        if rebuilding:
            # Asked to forget what was learned: a fresh forecaster, seeded from Prometheus below.
            mem.brain, mem.signal, mem.history_seeded, saved = None, None, False, None
        brain = self._brain(mem, namespace, name, spec, saved)
        seeding = not mem.history_seeded
        if seeding:
            n = self._seed_history(mem, namespace, name, spec)
        if seeding and (n or rebuilding):
            events.append(EventNote("Normal", "ForecasterSeeded",
                                    f"replayed {n} samples ({mem.seeded.get('spanSeconds', 0):.0f} s) of the signal's "
                                    f"history from Prometheus into the forecaster"
                                    + (f" (rebuild requested: {rebuild})" if rebuilding else "")))
        if rebuilding:
            mem.rebuild_handled = rebuild
            mem.last_persist_s = 0.0  # persist the rebuilt state with this step's status
        interval = self.interval(spec)

        core, apps = client.CoreV1Api(shared_api()), client.AppsV1Api(shared_api())
        try:
            dep = apps.read_namespaced_deployment(workload_name(name), namespace)
        except ApiException as exc:
            if exc.status == 404:  # the reconcile handler creates it; nothing to scale yet
                return StepResult([], min(interval, 5.0))
            raise
        current_replicas = dep.spec.replicas
        pod_list = core.list_namespaced_pod(namespace, label_selector=selector_string(selector_labels(name)))
        pods = [actuation.pod_view(_iso_to_api(p)) for p in pod_list.items]
        counts = actuation.count(pods)

        # Cold start: creation -> Ready, first time each pod is seen Ready (a rolling window).
        for pod_name, seconds in actuation.cold_start_samples(pods).items():
            if pod_name not in mem.cold_starts:
                mem.cold_starts[pod_name] = seconds
                while len(mem.cold_starts) > COLD_START_WINDOW:
                    mem.cold_starts.pop(next(iter(mem.cold_starts)))
        samples = tuple(mem.cold_starts.values())
        cold_p90 = planned_cold_start_s(brain.config, samples)

        observed: MetricsResult = self.source(spec).observe(signal_queries(namespace, name, spec))
        if observed.available:
            mem.metrics_failures = 0
        else:
            mem.metrics_failures += 1
        obs = observation(now_s, counts, samples, observed)
        decision = brain.step(obs)
        preview = spec.scaling.mode is Mode.preview
        plan = actuation.plan(pods, decision.serving, decision.total, current_replicas)

        # Forecast error: compare the forecast made one lead time ago with what arrived.
        if observed.available and observed.value is not None:
            while mem.forecasts and mem.forecasts[0][0] <= now_s:
                _, predicted = mem.forecasts.popleft()
                if observed.value > 0:
                    metrics.forecast_error.labels(namespace, name).set(
                        abs(predicted - observed.value) / observed.value
                    )
            if decision.forecast_value is not None:
                mem.forecasts.append((now_s + decision.lead_time_s, decision.forecast_value))

        reason = str(decision.reason)
        metrics.decisions.labels(namespace, name, reason).inc()
        desired_changed = current_replicas != decision.total
        if not preview:
            applied = plan
        else:
            # Preview: the Deployment's replicas belong to whoever scales it today; Preheat only keeps
            # every Ready pod serving (no warm pool) and reports what it would have done.
            applied = dataclasses.replace(actuation.plan(pods, counts.ready, counts.ready, None), replicas=None)
            if (desired_changed or plan.promote or plan.demote) and (reason != mem.last_reason or desired_changed):
                events.append(EventNote("Normal", "PreviewDecision",
                                        f"would set serving {counts.serving_ready} -> {decision.serving}, "
                                        f"replicas {current_replicas} -> {decision.total}: {decision.detail}"))
        self._apply(namespace, name, applied, current_replicas, decision, events)
        mem.last_reason = reason

        # Failing pods: say why once per distinct message, keep scaling the rest.
        failing = actuation.first_failure(pods)
        if failing is not None and failing.failure != mem.last_failure_event:
            events.append(EventNote("Warning", "ModelServerFailing", f"pod {failing.name}: {failing.failure}"))
            mem.last_failure_event = failing.failure
        elif failing is None:
            mem.last_failure_event = ""

        serving_after = counts.serving_ready + len(applied.promote) - len(applied.demote)
        warm_after = counts.warm_ready - len(applied.promote) + len(applied.demote)
        conditions = [
            st.ready_condition(serving_after, spec.scaling.min_replicas, counts.failing,
                               failing.failure if failing else ""),
            st.scaling_condition(current_replicas, decision.total, plan.shortfall, preview),
            st.Condition(st.METRICS_AVAILABLE, True, observed.reason, observed.message)
            if observed.available
            else st.Condition(st.METRICS_AVAILABLE, False, observed.reason,
                              f"{observed.message}; holding {counts.serving_ready} serving replica(s)"),
            self._forecast_condition(spec, brain),
        ]
        fields: dict[str, Any] = {
            "servingReplicas": serving_after,
            "warmReplicas": warm_after,
            "desiredReplicas": decision.total,
            "desiredServingReplicas": decision.serving,
            "readyReplicas": counts.ready,
            "startingReplicas": counts.starting,
            "failingReplicas": counts.failing,
            "observedRate": st.round_rate(observed.value) if observed.available else None,
            "forecastRate": st.round_rate(decision.forecast_value),
            "forecastUpper": st.round_rate(decision.forecast_upper),
            "leadTimeSeconds": round(decision.lead_time_s, 1),
            "coldStartSeconds": round(cold_p90, 1) if cold_p90 is not None else None,
            "selector": selector_string(serving_selector(name)),
            "signal": str(spec.scaling.signal),
            "lastEvaluationTime": now,  # a heartbeat: the loop ran, even when it changed nothing
            "operator": self.options.identity or None,
        }
        if rebuilding:
            fields["forecasterRebuild"] = {"request": rebuild, **mem.seeded}
        if desired_changed or plan.promote or plan.demote or not previous.get("lastDecision"):
            fields["lastDecision"] = {
                "time": now,
                "from": current_replicas,
                "to": decision.total,
                "servingFrom": counts.serving_ready,
                "servingTo": decision.serving,
                "reason": reason,
                "detail": decision.detail[:1000],
                "applied": not preview,
            }
        if now_s - mem.last_persist_s >= PERSIST_EVERY_S:
            # A JSON string, not an object: a merge patch would turn the state's nulls into deletions.
            state = json.dumps(brain.to_dict(), separators=(",", ":"))
            if len(state) <= MAX_PERSIST_BYTES:
                fields["forecaster"] = state
                mem.last_persist_s = now_s
        status = st.build_status(generation=generation, previous=previous, conditions=conditions, now=now,
                                 fields=fields)
        self._write_status(namespace, name, status)
        self._export(namespace, name, spec, decision, counts, serving_after, warm_after, observed, cold_p90)

        sleep = interval
        if not observed.available:
            sleep = interval * min(2 ** (mem.metrics_failures - 1), MAX_BACKOFF_FACTOR)
        if plan.shortfall or counts.starting:
            sleep = min(sleep, max(1.0, interval / 3))  # promote as soon as a warm pod is Ready
        return StepResult(events, sleep, decision)

    def _forecast_condition(self, spec: InferenceEndpointSpec, brain: Brain) -> st.Condition:
        if self.options.reactive_only:
            return st.Condition(st.FORECAST_READY, False, "ReactiveOnly", "operator runs with --reactive-only")
        if not spec.scaling.forecasting.enabled:
            return st.Condition(st.FORECAST_READY, False, "ForecastingDisabled", "scaling.forecasting.enabled is false")
        if brain.forecaster is None:
            return st.Condition(st.FORECAST_READY, False, "NoForecaster", "no forecaster available")
        if brain.forecast_ready:
            return st.Condition(st.FORECAST_READY, True, "HistoryComplete", "forecaster has the history it needs")
        return st.Condition(st.FORECAST_READY, False, "CollectingHistory", "forecaster is still learning the load")

    def _apply(self, namespace: str, name: str, plan: actuation.Plan, current_replicas: int | None,
               decision: Decision, events: list[EventNote]) -> None:
        """Promotions/demotions first (capacity in seconds; removal from the Service before any pod
        stops), then the Deployment's replicas (ReplicaSet removes the cheapest, i.e. warm, pods)."""
        core, apps = client.CoreV1Api(shared_api()), client.AppsV1Api(shared_api())
        for patch in plan.patches():
            try:
                retry_conflict(lambda p=patch: core.patch_namespaced_pod(p.name, namespace, p.body()))
            except ApiException as exc:
                if exc.status == 404:  # the pod went away meanwhile: the next step sees it
                    continue
                raise
        if plan.promote:
            metrics.promotions.labels(namespace, name).inc(len(plan.promote))
            events.append(EventNote("Normal", "Promoted",
                                    f"promoted warm pod(s) {', '.join(plan.promote)} to serving "
                                    f"({decision.reason}: serving -> {decision.serving})"))
        if plan.demote:
            metrics.demotions.labels(namespace, name).inc(len(plan.demote))
            events.append(EventNote("Normal", "Demoted",
                                    f"demoted serving pod(s) {', '.join(plan.demote)} to the warm pool "
                                    f"({decision.reason}: serving -> {decision.serving})"))
        if plan.replicas is not None:
            retry_conflict(lambda: apps.patch_namespaced_deployment_scale(
                workload_name(name), namespace, {"spec": {"replicas": plan.replicas}}))
            direction = "up" if current_replicas is None or plan.replicas > current_replicas else "down"
            metrics.scale_actions.labels(namespace, name, direction).inc()
            events.append(EventNote("Normal", "ScaledUp" if direction == "up" else "ScaledDown",
                                    f"replicas {current_replicas} -> {plan.replicas} (serving {decision.serving}, "
                                    f"warm pool {decision.warm}): {decision.detail}"[:1000]))
        if plan.shortfall and decision.reason is not Reason.HOLD:
            log.info("%s/%s: %d serving replica(s) wait for warm pods to load", namespace, name, plan.shortfall)

    def _write_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        api = client.CustomObjectsApi(shared_api())
        try:
            retry_conflict(lambda: api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}))
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile
                raise

    def _export(self, namespace: str, name: str, spec: InferenceEndpointSpec, decision: Decision,
                counts: actuation.PodCounts, serving: int, warm: int, observed: MetricsResult,
                cold_p90: float | None) -> None:
        ep = (namespace, name)
        for kind, value in (("serving", serving), ("warm", warm), ("desired", decision.total),
                            ("ready", counts.ready), ("starting", counts.starting)):
            metrics.replicas.labels(*ep, kind).set(value)
        metrics.metrics_available.labels(*ep).set(1 if observed.available else 0)
        if observed.available and observed.value is not None:
            metrics.observed_rate.labels(*ep).set(observed.value)
        if decision.forecast_value is not None:
            metrics.forecast_rate.labels(*ep).set(decision.forecast_value)
        if decision.forecast_upper is not None:
            metrics.forecast_upper.labels(*ep).set(decision.forecast_upper)
        metrics.capacity.labels(*ep).set(serving * spec.scaling.target_per_replica)
        metrics.lead_time.labels(*ep).set(decision.lead_time_s)
        if cold_p90 is not None:
            metrics.cold_start.labels(*ep).set(cold_p90)
