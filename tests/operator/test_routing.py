"""Scale to zero with an activator: the manifests, the routing rule and the signal at zero pods."""

from __future__ import annotations

from preheat.controller import builders, routing
from preheat.controller.observe import PrometheusSource, signal_queries
from preheat.controller.spec import parse_spec
from preheat.scaling.policy.types import Decision, Reason

OWNER = {"apiVersion": "preheat.dev/v1alpha1", "kind": "InferenceEndpoint", "metadata": {"name": "chat", "uid": "u1"}}


def _spec(**scaling):
    return parse_spec({"model": {"builtin": "tiny"}, "scaling": scaling})


def test_activator_forwards_to_a_private_service_of_the_serving_pods():
    spec = _spec(minReplicas=0, scaleToZero=True)
    dep = routing.activator_deployment("chat", "team", spec, OWNER, image="preheat/operator:dev")
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["image"] == "preheat/operator:dev" and c["command"] == ["preheat"]
    assert c["args"][:3] == ["activator", "--upstream", f"http://chat-serving.team.svc:{spec.server.port}"]
    assert c["ports"][0]["name"] == "http"  # the public Service's targetPort fits the activator too
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(routing.ACTIVATOR_PORT)
    # Not a model-server target: Prometheus would count it in up{endpoint=...}, and collect() list it.
    assert builders.LABEL_ENDPOINT not in pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == routing.activator_selector("chat")
    assert not set(builders.selector_labels("chat").items()) <= set(pod["metadata"]["labels"].items())
    svc = routing.serving_service("chat", "team", spec, OWNER)
    assert svc["metadata"]["name"] == "chat-serving" and svc["spec"]["selector"] == builders.serving_selector("chat")


def test_the_public_service_goes_to_the_activator_before_the_last_pod_and_back_once_one_serves():
    auto = _spec(minReplicas=0, scaleToZero=True)
    assert routing.to_activator(_spec(), 0, False) is None  # no scale to zero: no activator, nothing to route
    assert routing.to_activator(auto, 0, False) is True  # nothing serves: the activator holds the requests
    assert routing.to_activator(auto, 1, True) is True  # the decision is zero: the activator first
    assert routing.to_activator(auto, 1, False) is False
    preview = _spec(minReplicas=0, scaleToZero=True, mode="Preview")
    assert routing.to_activator(preview, 1, True) is False  # Preview scales nothing: the pod keeps serving
    assert routing.public_selector("chat", True) == routing.activator_selector("chat")
    assert routing.public_selector("chat", False) == builders.serving_selector("chat")


def _decision(serving: int) -> Decision:
    return Decision(serving=serving, warm=0, reason=Reason.SCALE_TO_ZERO if serving == 0 else Reason.REACTIVE,
                    detail="d")


def test_zero_waits_for_a_ready_activator_that_the_service_already_selects():
    assert routing.gate(_decision(0), None) == routing.Gate(_decision(0), False)  # no activator: as decided
    assert routing.gate(_decision(2), routing.ActivatorSeen(False, False)) == routing.Gate(_decision(2), False)
    blocked = routing.gate(_decision(0), routing.ActivatorSeen(ready=False, routed=False))
    assert blocked.decision.serving == 1 and not blocked.route_first and "not Ready" in blocked.blocked
    first = routing.gate(_decision(0), routing.ActivatorSeen(ready=True, routed=False))
    assert first.decision.serving == 1 and first.route_first and first.blocked is None
    assert "next step" in first.decision.detail
    then = routing.gate(_decision(0), routing.ActivatorSeen(ready=True, routed=True))
    assert then.decision.serving == 0 and then.route_first


def test_activator_queries_only_with_scale_to_zero():
    assert "activator" not in signal_queries("team", "chat", _spec())
    q = signal_queries("team", "chat", _spec(minReplicas=0, scaleToZero=True))
    assert q["activator"] == 'sum(rate(preheat:activator_requests_total{namespace="team",endpoint="chat"}[1m]))'
    assert q["activator_targets"].startswith("count(preheat:activator_requests_waiting{")
    q = signal_queries("team", "chat", _spec(minReplicas=0, scaleToZero=True, signal="concurrency"))
    assert q["activator"] == q["activator_waiting"]  # held requests are the concurrency


class _Answers(PrometheusSource):
    """PrometheusSource whose PromQL answers come from a table (the cluster tests use a real one)."""

    def __init__(self, answers: dict[str, float | None]) -> None:
        self.url, self.answers = "table", answers

    def _query(self, q):
        for metric, value in self.answers.items():
            if metric in q:
                return [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return []


def test_at_zero_pods_the_activator_count_is_a_fresh_signal():
    q = signal_queries("team", "chat", _spec(minReplicas=0, scaleToZero=True))
    seen = _Answers({"up{": None, "count(preheat:activator": 1, "activator_requests_total": 0.5,
                     "sum(preheat:activator_requests_waiting": 3}).observe(q)
    assert seen.available and seen.reason == "ActivatorMetrics"
    assert (seen.signal, seen.signal_panic, seen.queue, seen.running) == (0.5, 0.5, 3.0, 0.0)
    # No activator scraped either: no data, the loop holds.
    none = _Answers({"up{": None, "count(preheat:activator": None}).observe(q)
    assert not none.available and none.reason == "NoMetrics" and "activator" in none.message
    # Model servers are up: their counters are the signal, the activator's are not read.
    up = _Answers({"up{": 1, "requests_received_total": 7.0, "activator": 99.0}).observe(q)
    assert up.reason == "MetricsFound" and up.signal == 7.0
