"""Status conditions (transition times) and the PromQL the loop runs; Prometheus down is 'no data'."""

from __future__ import annotations

import socket

import pytest
from preheat.controller import status as st
from preheat.controller.observe import PrometheusSource, signal_queries
from preheat.controller.spec import duration_s, parse_spec
from preheat.scaling.from_spec import policy_config
from preheat.scaling.policy import PolicyConfig
from preheat.scaling.policy.scale_down import hold_lead_times


def test_transition_time_moves_only_when_status_flips():
    c1 = st.merge_conditions(None, [st.Condition(st.READY, False, "WaitingForReplicas")], 1, "t1")
    c2 = st.merge_conditions(c1, [st.Condition(st.READY, False, "Other", "msg")], 2, "t2")
    c3 = st.merge_conditions(c2, [st.Condition(st.READY, True, "ServingReplicasReady")], 2, "t3")
    assert c2[0]["lastTransitionTime"] == "t1" and c2[0]["observedGeneration"] == 2
    assert c3[0]["lastTransitionTime"] == "t3" and c3[0]["status"] == "True"


def test_ready_condition_explains_failures():
    c = st.ready_condition(0, 1, 1, "CrashLoopBackOff (exit code 2): model path /x does not exist")
    assert c.status is False and c.reason == "ModelServerFailing" and "/x does not exist" in c.message
    assert st.ready_condition(1, 1, 0, "").status is True
    assert st.ready_condition(0, 1, 0, "").reason == "WaitingForReplicas"


def test_queries_select_the_endpoint_and_honour_overrides():
    spec = parse_spec({"model": {"builtin": "tiny"}})
    q = signal_queries("team", "chat", spec)
    assert 'preheat:requests_received_total{namespace="team",endpoint="chat"}[1m]' in q["signal"]
    assert "[20s]" in q["signal_panic"]
    spec = parse_spec({"model": {"builtin": "tiny"},
                       "scaling": {"signal": "concurrency"},
                       "prometheus": {"queries": {"concurrency": 'sum(my_inflight{ns="$namespace",ep="$endpoint"})'}}})
    q = signal_queries("team", "chat", spec)
    assert q["signal"] == 'sum(my_inflight{ns="team",ep="chat"})'


def test_policy_config_from_spec_and_reactive_only():
    spec = parse_spec({"model": {"builtin": "tiny"},
                       "scaling": {"minReplicas": 2, "maxReplicas": 6, "targetPerReplica": 3,
                                   "warmPool": {"min": 1, "max": 2}}})
    cfg = policy_config(spec)
    assert (cfg.min_replicas, cfg.max_replicas, cfg.target_per_replica) == (2, 6, 3.0)
    assert cfg.forecasting and cfg.warm_pool_min == 1
    assert cfg.burst_memory_s == 0.0 and cfg.burst_threshold == PolicyConfig().burst_threshold  # off, same default
    reactive = policy_config(spec, reactive_only=True)
    assert not reactive.forecasting and reactive.warm_pool_max == 0


def test_target_utilization_from_spec_sizes_serving_and_prices_the_hold():
    assert policy_config(parse_spec({"model": {"builtin": "tiny"}})).target_utilization == \
        PolicyConfig().target_utilization  # the CRD's default is the policy's
    spec = parse_spec({"model": {"builtin": "tiny"}, "scaling": {"targetPerReplica": 3, "targetUtilization": 0.5}})
    cfg = policy_config(spec)
    assert cfg.target_utilization == 0.5 and cfg.capacity_per_replica == 1.5
    assert hold_lead_times(cfg) == 3.0  # 1 + 1/U: more headroom bought, a longer hold


def test_burst_envelope_from_spec_and_off_when_reactive_only():
    spec = parse_spec({"model": {"builtin": "tiny"},
                       "scaling": {"warmPool": {"max": 3, "burstMemorySeconds": 120, "burstThreshold": 2}}})
    cfg = policy_config(spec)
    assert (cfg.burst_memory_s, cfg.burst_threshold, cfg.warm_pool_max) == (120.0, 2.0, 3)
    reactive = policy_config(spec, reactive_only=True)
    assert reactive.burst_memory_s == 0.0 and reactive.warm_pool_max == 0
    for bad in ({"burstMemorySeconds": -1}, {"burstMemorySeconds": 3601}, {"burstThreshold": 0.5}):
        with pytest.raises(ValueError):
            parse_spec({"model": {"builtin": "tiny"}, "scaling": {"warmPool": bad}})
    assert duration_s("20s") == 20 and duration_s("1m") == 60


def test_unreachable_prometheus_is_reported_not_raised():
    # A port nothing listens on, on loopback: the real connection is refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = parse_spec({"model": {"builtin": "tiny"}})
    result = PrometheusSource(f"http://127.0.0.1:{port}", timeout_s=1).observe(signal_queries("ns", "ep", spec))
    assert result.available is False and result.reason == "PrometheusUnreachable"
    assert f"127.0.0.1:{port}" in result.message
