"""Step: what one autoscaling step decides, from what `collect` found. Pure: no API call, no Prometheus.

Collected (pods, replicas, metrics) -> the observation the policy sees -> the endpoint's Autoscaler ->
its decision -> the actuation plan (`actuation.plan`) -> the `.status` patch and the Events. `scale.py`
then applies the plan. The endpoint's state (`endpoint.Endpoint`) moves forward here: the cold-start
window, the forecasts being scored, the failure and reason last reported.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from preheat.controller import actuation, routing
from preheat.controller import status as st
from preheat.controller.builders import pod_sizes, selector_string, serving_selector
from preheat.controller.collect import Collected
from preheat.controller.endpoint import Endpoint
from preheat.controller.observe import MetricsResult
from preheat.controller.spec import InferenceEndpointSpec, Mode
from preheat.scaling.from_spec import forecast_ready, saved_state
from preheat.scaling.policy.signal import clean_cold_starts, cold_start_s
from preheat.scaling.policy.types import Decision, Observation, PolicyConfig

PERSIST_EVERY_S = 60.0  # how often the forecaster's state goes into .status (it is rebuilt anyway)
MAX_PERSIST_BYTES = 100_000
MAX_BACKOFF_FACTOR = 4  # metrics failures stretch the interval up to 4x, never more


@dataclass(frozen=True)
class EventNote:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class StepContext:
    """What a step knows besides the endpoint's state: the CR and the operator's options."""

    name: str
    generation: int | None
    previous: dict[str, Any]  # the CR's .status as read
    now: str  # the step's time, as status writes it
    interval_s: float
    reactive_only: bool = False
    identity: str = ""
    rebuild: dict[str, Any] | None = None  # status.forecasterRebuild, when this step handled a rebuild


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    plan: actuation.Plan  # what the decision asks of the pods and the Deployment
    applied: actuation.Plan  # what scale.py applies (Preview: only every Ready pod serving)
    status: dict[str, Any]
    events: list[EventNote]
    sleep_s: float
    cold_start_s: float | None
    forecast_error: float | None
    serving: int  # serving replicas once the plan is applied
    warm: int
    to_activator: bool | None = None  # where the public Service points after the step (None: no activator)


def observation(now_s: float, counts: actuation.PodCounts, samples: tuple[float, ...],
                observed: MetricsResult) -> Observation:
    """What the policy sees this step. `current_serving` is the Ready pods labelled serving: new pods
    start in the warm pool and are promoted when Ready, so no starting pod is ever labelled serving
    (the simulator reports the same, `ReplicaPool.observed_serving`)."""
    return Observation(
        time_s=now_s,
        value=observed.signal if observed.available else None,
        value_panic=observed.signal_panic if observed.available else None,
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


def step(ep: Endpoint, spec: InferenceEndpointSpec, seen: Collected, ctx: StepContext) -> Outcome:
    """Decide, plan, and say so (status, Events); `ep` moves to this step's state."""
    assert ep.autoscaler is not None  # the loop built it for this spec before collecting
    counts, m = seen.counts, seen.metrics
    samples = ep.cold_starts.add(actuation.cold_start_samples(seen.pods))
    ep.metrics_failures = 0 if m.available else ep.metrics_failures + 1
    gate = routing.gate(ep.autoscaler.step(observation(seen.now_s, counts, samples, m)), seen.activator)
    decision = gate.decision
    error = _score_forecast(ep, seen, decision)
    sizes = pod_sizes(spec)
    plan = actuation.plan(seen.pods, decision.serving, decision.total, seen.replicas, sizes)
    preview = spec.scaling.mode is Mode.preview
    # Preview: the Deployment's replicas belong to whoever scales it today; Preheat only keeps every
    # Ready pod serving (no warm pool) and reports what it would have done.
    applied = (dataclasses.replace(actuation.plan(seen.pods, counts.ready, counts.ready, None, sizes), replicas=None)
               if preview else plan)
    events = _preview_events(ep, seen, decision, plan) if preview else []
    events += _actuation_events(applied, seen.replicas, decision)
    ep.last_reason = str(decision.reason)
    failing = actuation.first_failure(seen.pods)
    events += _failure_events(ep, failing) + _activator_events(ep, gate.blocked)
    serving = counts.serving_ready + len(applied.promote) - len(applied.demote)
    warm = counts.warm_ready - len(applied.promote) + len(applied.demote)
    cold = planned_cold_start_s(ep.autoscaler.config, samples)
    conditions = _conditions(ep, spec, seen, ctx, decision, plan, serving, failing)
    fields = _fields(ep, spec, seen, ctx, decision, plan, serving, warm, cold)
    status = st.build_status(generation=ctx.generation, previous=ctx.previous, conditions=conditions,
                             now=ctx.now, fields=fields)
    return Outcome(decision, plan, applied, status, events, _sleep_s(ep, seen, plan, ctx.interval_s), cold,
                   error, serving, warm, routing.to_activator(spec, serving, gate.route_first))


def _activator_events(ep: Endpoint, blocked: str | None) -> list[EventNote]:
    """One Warning when scale to zero is first held back by an activator that is not Ready."""
    was, ep.activator_blocked = ep.activator_blocked, blocked is not None
    return [EventNote("Warning", "ActivatorNotReady", blocked)] if blocked and not was else []


def _score_forecast(ep: Endpoint, seen: Collected, decision: Decision) -> float | None:
    """Score the forecast made one lead time ago against the signal that arrived; file this one."""
    m = seen.metrics
    if not m.available or m.signal is None:
        return None
    error = ep.forecasts.score(seen.now_s, m.signal)
    if decision.forecast_value is not None:
        ep.forecasts.add(seen.now_s + decision.lead_time_s, decision.forecast_value)
    return error


def _preview_events(ep: Endpoint, seen: Collected, decision: Decision, plan: actuation.Plan) -> list[EventNote]:
    """PreviewDecision: what Auto mode would do, once per change of decision or reason."""
    changed = seen.replicas != decision.total
    if (changed or plan.promote or plan.demote) and (str(decision.reason) != ep.last_reason or changed):
        return [EventNote("Normal", "PreviewDecision",
                          f"would set serving {seen.counts.serving_ready} -> {decision.serving}, "
                          f"replicas {seen.replicas} -> {decision.total}: {decision.detail}")]
    return []


def _actuation_events(applied: actuation.Plan, current_replicas: int | None, decision: Decision) -> list[EventNote]:
    events = []
    why = f"({decision.reason}: serving -> {decision.serving})"
    if applied.promote:
        events.append(EventNote("Normal", "Promoted",
                                f"promoted warm pod(s) {', '.join(applied.promote)} to serving {why}"))
    if applied.demote:
        events.append(EventNote("Normal", "Demoted",
                                f"demoted serving pod(s) {', '.join(applied.demote)} to the warm pool {why}"))
    if applied.replicas is not None:
        up = current_replicas is None or applied.replicas > current_replicas
        events.append(EventNote("Normal", "ScaledUp" if up else "ScaledDown",
                                f"replicas {current_replicas} -> {applied.replicas} (serving {decision.serving}, "
                                f"warm pool {decision.warm}): {decision.detail}"[:1000]))
    return events


def _failure_events(ep: Endpoint, failing: actuation.PodView | None) -> list[EventNote]:
    """Failing pods: say why once per distinct message (the loop keeps scaling the rest)."""
    if failing is None:
        ep.last_failure_event = ""
        return []
    if failing.failure == ep.last_failure_event:
        return []
    ep.last_failure_event = failing.failure
    return [EventNote("Warning", "ModelServerFailing", f"pod {failing.name}: {failing.failure}")]


def _conditions(ep: Endpoint, spec: InferenceEndpointSpec, seen: Collected, ctx: StepContext, decision: Decision,
                plan: actuation.Plan, serving: int, failing: actuation.PodView | None) -> list[st.Condition]:
    counts, m = seen.counts, seen.metrics
    metrics = (st.Condition(st.METRICS_AVAILABLE, True, m.reason, m.message) if m.available else
               st.Condition(st.METRICS_AVAILABLE, False, m.reason,
                            f"{m.message}; holding {counts.serving_ready} serving replica(s)"))
    return [
        st.ready_condition(serving, spec.scaling.min_replicas, counts.failing, failing.failure if failing else ""),
        st.scaling_condition(seen.replicas, decision.total, plan.shortfall, spec.scaling.mode is Mode.preview),
        metrics,
        _forecast_condition(ep, spec, ctx.reactive_only),
    ]


def _forecast_condition(ep: Endpoint, spec: InferenceEndpointSpec, reactive_only: bool) -> st.Condition:
    if reactive_only:
        return st.Condition(st.FORECAST_READY, False, "ReactiveOnly", "operator runs with --reactive-only")
    if not spec.scaling.forecasting.enabled:
        return st.Condition(st.FORECAST_READY, False, "ForecastingDisabled", "scaling.forecasting.enabled is false")
    if ep.autoscaler is None or ep.autoscaler.forecaster is None:
        return st.Condition(st.FORECAST_READY, False, "NoForecaster", "no forecaster available")
    if forecast_ready(ep.autoscaler):
        return st.Condition(st.FORECAST_READY, True, "HistoryComplete", "forecaster has the history it needs")
    return st.Condition(st.FORECAST_READY, False, "CollectingHistory", "forecaster is still learning the load")


def _fields(ep: Endpoint, spec: InferenceEndpointSpec, seen: Collected, ctx: StepContext, decision: Decision,
            plan: actuation.Plan, serving: int, warm: int, cold: float | None) -> dict[str, Any]:
    """The status fields besides conditions (build_status drops the None ones)."""
    counts, m = seen.counts, seen.metrics
    fields: dict[str, Any] = {
        "servingReplicas": serving,
        "warmReplicas": warm,
        # A warm replica's cost relative to a serving one, and the fleet's cost in serving replicas.
        "warmCostFraction": round(fraction := spec.warm_cost_fraction(), 4),
        "replicaCost": round(serving + warm * fraction, 3),
        "desiredReplicas": decision.total,
        "desiredServingReplicas": decision.serving,
        "readyReplicas": counts.ready,
        "startingReplicas": counts.starting,
        "failingReplicas": counts.failing,
        "observedSignal": st.round_signal(m.signal) if m.available else None,
        "forecastSignal": st.round_signal(decision.forecast_value),
        "forecastSignalUpper": st.round_signal(decision.forecast_upper),
        "leadTimeSeconds": round(decision.lead_time_s, 1),
        "coldStartSeconds": round(cold, 1) if cold is not None else None,
        "selector": selector_string(serving_selector(ctx.name)),
        "signal": str(spec.scaling.signal),
        "lastEvaluationTime": ctx.now,  # a heartbeat: the loop ran, even when it changed nothing
        "operator": ctx.identity or None,
        "forecasterRebuild": ctx.rebuild,
        "lastDecision": _last_decision(seen, ctx, decision, plan, spec.scaling.mode is Mode.preview),
        "forecaster": _persisted(ep, seen.now_s),
    }
    # v1alpha1's names for the signal fields, written beside the new ones for one version.
    for old, new in (("observedRate", "observedSignal"), ("forecastRate", "forecastSignal"),
                     ("forecastUpper", "forecastSignalUpper")):
        fields[old] = fields[new]
    return fields


def _last_decision(seen: Collected, ctx: StepContext, decision: Decision, plan: actuation.Plan,
                   preview: bool) -> dict[str, Any] | None:
    """status.lastDecision, rewritten when the decision changes something (or there is none yet)."""
    if seen.replicas == decision.total and not (plan.promote or plan.demote) and ctx.previous.get("lastDecision"):
        return None
    return {"time": ctx.now, "from": seen.replicas, "to": decision.total,
            "servingFrom": seen.counts.serving_ready, "servingTo": decision.serving, "reason": str(decision.reason),
            "detail": decision.detail[:1000], "applied": not preview}


def _persisted(ep: Endpoint, now_s: float) -> str | None:
    """status.forecaster every PERSIST_EVERY_S: a JSON string, not an object (a merge patch would turn the
    state's nulls into deletions); None when not due or too large for the object."""
    if ep.autoscaler is None or ep.key is None or now_s - ep.last_persist_s < PERSIST_EVERY_S:
        return None
    state = json.dumps(saved_state(ep.autoscaler, ep.key), separators=(",", ":"))
    if len(state) > MAX_PERSIST_BYTES:
        return None
    ep.last_persist_s = now_s
    return state


def _sleep_s(ep: Endpoint, seen: Collected, plan: actuation.Plan, interval_s: float) -> float:
    sleep = interval_s
    if not seen.metrics.available:
        sleep = interval_s * min(2 ** (ep.metrics_failures - 1), MAX_BACKOFF_FACTOR)
    if plan.shortfall or seen.counts.starting:
        sleep = min(sleep, max(1.0, interval_s / 3))  # promote as soon as a warm pod is Ready
    return sleep
