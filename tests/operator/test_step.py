"""The operator's step without a cluster: `step.step` is pure, so what one collect gives it (pods, the
Deployment's replicas, metrics) fully decides the plan, the status and the Events."""

from __future__ import annotations

import pytest
from preheat.controller.actuation import PodView
from preheat.controller.builders import COST_SERVING, COST_WARM, ROLE_SERVING, ROLE_WARM
from preheat.controller.collect import Collected
from preheat.controller.endpoint import COLD_START_WINDOW, ColdStartWindow, Endpoint, ForecastScore
from preheat.controller.observe import MetricsResult
from preheat.controller.routing import ActivatorSeen
from preheat.controller.spec import parse_spec
from preheat.controller.step import StepContext, step
from preheat.scaling.from_spec import policy_config

NOW = 1_800_000_000.0


def pod(name: str, role: str, ready: bool = True, created: float = NOW - 300, loaded: float = 40.0) -> PodView:
    cost = COST_SERVING if role == ROLE_SERVING else COST_WARM
    return PodView(name, role, ready, False, created, created + loaded if ready else None, False, "", cost)


def endpoint(spec) -> Endpoint:
    ep = Endpoint()
    ep.autoscaler_for(spec, policy_config(spec), None, "ns/ep")
    return ep


def ctx(**kw) -> StepContext:
    return StepContext(name="ep", generation=3, previous={}, now="2027-01-15T08:00:00Z", interval_s=15.0, **kw)


SPEC = {"model": {"builtin": "tiny"},
        "scaling": {"minReplicas": 1, "maxReplicas": 6, "targetPerReplica": 2,
                    "forecasting": {"enabled": False}, "warmPool": {"min": 1, "max": 2}}}


def test_a_load_above_one_replica_promotes_the_warm_pod_and_says_so():
    spec = parse_spec(SPEC)
    ep = endpoint(spec)
    seen = Collected(NOW, 2, [pod("s1", ROLE_SERVING), pod("w1", ROLE_WARM)],
                     MetricsResult(True, "MetricsFound", "1 target(s) scraped", signal=2.5, signal_panic=2.5,
                                   queue=0.0, targets=2))
    out = step(ep, spec, seen, ctx())
    assert out.decision.serving == 2
    assert out.applied.promote == ("w1",) and out.plan == out.applied
    assert (out.serving, out.warm) == (2, 0)
    assert [e.reason for e in out.events][:1] == ["Promoted"]
    s = out.status
    # the signal under its one name, and under v1alpha1's for one version
    assert s["observedSignal"] == s["observedRate"] == 2.5
    assert s["desiredServingReplicas"] == 2 and s["servingReplicas"] == 2
    assert s["coldStartSeconds"] == 40.0 and s["lastDecision"]["applied"] is True
    assert s["lastDecision"]["reason"] == str(out.decision.reason)
    assert {c["type"]: c["status"] for c in s["conditions"]}["MetricsAvailable"] == "True"
    assert s["observedGeneration"] == 3 and "forecaster" in s  # first step persists the state
    assert ep.cold_starts.samples == (40.0, 40.0)


def test_preview_keeps_replicas_and_reports_what_it_would_do():
    spec = parse_spec({**SPEC, "scaling": {**SPEC["scaling"], "mode": "Preview"}})
    ep = endpoint(spec)
    seen = Collected(NOW, 1, [pod("s1", ROLE_SERVING)],
                     MetricsResult(True, "MetricsFound", "", signal=9.0, signal_panic=9.0, queue=0.0, targets=1))
    out = step(ep, spec, seen, ctx())
    assert out.plan.replicas == out.decision.total > 1
    assert out.applied.replicas is None and not out.applied.promote
    assert [e.reason for e in out.events] == ["PreviewDecision"]
    assert out.status["lastDecision"]["applied"] is False
    again = step(ep, spec, Collected(NOW + 15, 1, seen.pods, seen.metrics), ctx())
    assert [e.reason for e in again.events] == ["PreviewDecision"]  # the Deployment still differs from it


def test_prometheus_down_holds_backs_off_and_says_why():
    spec = parse_spec(SPEC)
    ep = endpoint(spec)
    down = MetricsResult(False, "PrometheusUnreachable", "http://x: ConnectionError")
    seen = Collected(NOW, 2, [pod("s1", ROLE_SERVING), pod("w1", ROLE_WARM)], down)
    sleeps = [step(ep, spec, Collected(NOW + 15 * i, 2, seen.pods, down), ctx()).sleep_s for i in range(4)]
    assert sleeps == [15.0, 30.0, 60.0, 60.0]  # 1, 2, 4, 4 intervals
    out = step(ep, spec, seen, ctx())
    assert out.applied.replicas is None and not out.applied.demote  # holds
    metrics = {c["type"]: c for c in out.status["conditions"]}["MetricsAvailable"]
    assert metrics["status"] == "False" and metrics["reason"] == "PrometheusUnreachable"
    assert "observedSignal" not in out.status


def test_a_failing_pod_is_reported_once_per_message():
    spec = parse_spec(SPEC)
    ep = endpoint(spec)
    bad = PodView("s2", ROLE_SERVING, False, False, NOW - 60, None, True, "CrashLoopBackOff (exit code 1): no model", "")
    metrics = MetricsResult(True, "MetricsFound", "", signal=1.0, signal_panic=1.0, queue=0.0, targets=1)
    pods = [pod("s1", ROLE_SERVING), pod("w1", ROLE_WARM), bad]
    first = step(ep, spec, Collected(NOW, 3, pods, metrics), ctx())
    second = step(ep, spec, Collected(NOW + 15, 3, pods, metrics), ctx())
    assert [e.reason for e in first.events if e.type == "Warning"] == ["ModelServerFailing"]
    assert [e for e in second.events if e.type == "Warning"] == []


def test_the_cold_start_window_counts_each_pod_once_and_keeps_the_last_ones():
    window = ColdStartWindow()
    window.add({"a": 10.0})
    assert window.add({"a": 99.0, "b": 20.0}) == (10.0, 20.0)  # a pod paid one cold start
    window.add({f"p{i}": 100.0 + i for i in range(COLD_START_WINDOW)})
    assert len(window.samples) == COLD_START_WINDOW and 10.0 not in window.samples


def test_a_forecast_is_scored_when_its_lead_time_has_passed():
    score = ForecastScore()
    score.add(NOW + 30, 12.0)
    assert score.score(NOW + 15, 10.0) is None  # not due yet
    assert score.score(NOW + 30, 10.0) == pytest.approx(0.2)  # |12 - 10| / 10
    assert score.score(NOW + 45, 10.0) is None and not score.pending


@pytest.mark.parametrize("forecasting", [True, False])
def test_scale_to_zero_waits_for_a_ready_activator_and_routes_to_it_first(forecasting):
    """With nobody to hold them, requests at zero would be refused: a decision of zero keeps one replica
    while the activator has no Ready pod (one Warning Event); once Ready, the step routes to it and keeps
    the replica one more step; with the Service on the activator, zero."""
    spec = parse_spec({"model": {"builtin": "tiny"},
                       "scaling": {"minReplicas": 0, "scaleToZero": True, "scaleToZeroGraceSeconds": 0,
                                   "warmPool": {"min": 0, "max": 0}, "forecasting": {"enabled": forecasting}}})
    ep = endpoint(spec)
    idle = MetricsResult(True, "MetricsFound", "", signal=0.0, signal_panic=0.0, queue=0.0, targets=1)

    def at(i: int, ready: bool, routed: bool):
        seen = Collected(NOW + 15 * i, 1, [pod("s1", ROLE_SERVING)], idle, ActivatorSeen(ready, routed))
        return step(ep, spec, seen, ctx())

    outs = [at(i, False, False) for i in range(3)]
    assert all(o.decision.serving == 1 and "activator is not Ready" in o.decision.detail for o in outs[1:])
    assert [e.reason for o in outs for e in o.events].count("ActivatorNotReady") == 1
    assert not any(o.to_activator for o in outs)
    first = at(4, True, False)
    assert first.decision.serving == 1 and first.to_activator is True and first.plan.replicas in (None, 1)
    then = at(5, True, True)
    assert then.decision.serving == 0 and then.plan.replicas == 0 and then.to_activator is True
