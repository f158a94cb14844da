"""One autoscaler, two hosts: the operator's per-step code and the simulator build the same
autoscaler from the same InferenceEndpoint spec, read the fleet the same way, and decide the same."""

from __future__ import annotations

import math

import numpy as np
import pytest
from preheat.controller import actuation
from preheat.controller.observe import MetricsResult
from preheat.controller.spec import parse_spec
from preheat.controller.step import observation, planned_cold_start_s
from preheat.scaling.from_spec import autoscaler_from_spec, policy_config
from preheat.scaling.policy import lead_time_s
from preheat.sim.baselines import SimContext
from preheat.sim.fleet import ReplicaPool
from preheat.sim.preheat_policy import PreheatPolicy
from preheat.sim.run import SimSettings, _gauges, prepare_workload
from preheat.sim.traces import SeriesTrace, load_cold_start

SPEC = parse_spec({
    "model": {"builtin": "tiny"},
    "scaling": {"minReplicas": 1, "maxReplicas": 12, "targetPerReplica": 10,
                "warmPool": {"min": 1, "max": 3, "burstMemorySeconds": 120}},
})


def _sim_policy(cold_s: float, utilization: float | None = None):
    """The simulator's Preheat on a fleet whose facts equal what the spec says (capacity, bounds), at the
    spec's target utilization unless the frontier's `utilization` is given."""
    t = np.arange(6) * 600.0
    trace = SeriesTrace("synthetic", t, np.full(6, 50.0), 600.0, "series")
    w = prepare_workload(trace, SimSettings(capacity_rps=10.0, promotion_s=5.0))
    cold = load_cold_start(str(cold_s))
    config = policy_config(SPEC)
    policy = PreheatPolicy(w, cold, spec=SPEC)
    ctx = SimContext(10.0, utilization or config.target_utilization, w.curve_t, w.curve_rate, w.peak_rate,
                     w.initial_rate, cold.sampler(0), max_replicas=SPEC.scaling.max_replicas)
    policy.prepare(ctx)
    return policy, cold


@pytest.mark.parametrize("u", [0.5, 0.9, 1.0])
def test_the_frontier_point_at_u_is_the_spec_with_that_target_utilization(u):
    # `preheat frontier` sweeps U; the operator runs exactly that policy from the spec that sets
    # scaling.targetUtilization: U (targetPerReplica the replica's capacity, here SPEC's 10), hold included.
    policy, _ = _sim_policy(45.0, utilization=u)
    scaling = SPEC.scaling.model_copy(update={"target_utilization": u})
    deployed = policy_config(SPEC.model_copy(update={"scaling": scaling}))
    assert policy.config == deployed
    assert deployed != policy_config(SPEC)  # U is not the CRD's default 0.8 here: the knob reached the policy


def test_operator_step_and_simulator_decide_identically_on_the_same_observations():
    policy, cold = _sim_policy(45.0)
    autoscaler = autoscaler_from_spec(SPEC, policy_config(SPEC))
    assert policy.config == autoscaler.config  # one spec -> one configuration, no second defaults table
    pool = ReplicaPool(cold.sampler(0), promotion_s=5.0)
    pool.seed(0.0, 2, 1)
    rng = np.random.default_rng(3)
    decisions = 0
    for k in range(240):  # an hour at 15 s: a ramp, a burst, a fall
        now = 1_800_000_000.0 + 15.0 * k
        pool.advance(now)
        level = 20.0 + 60.0 * math.sin(math.pi * k / 240) + (150.0 if 100 <= k < 104 else 0.0)
        value, panic = level + rng.normal(0, 2), level * (1.8 if 100 <= k < 104 else 1.0)
        samples = tuple(pool.observed_cold_starts)
        sim_obs = _gauges(now, pool, 0.0, None, value=value, value_panic=panic)
        counts = actuation.PodCounts(serving_ready=pool.observed_serving, warm_ready=pool.warm_ready,
                                     starting=pool.starting, failing=0, serving_labelled=pool.observed_serving)
        op_obs = observation(now, counts, samples, MetricsResult(True, "ok", "", signal=value, signal_panic=panic, queue=0.0))
        assert op_obs == sim_obs
        d_op, d_sim = autoscaler.step(op_obs), policy.decide(sim_obs)
        assert d_op == d_sim, (k, d_op.detail, d_sim.detail)
        decisions += d_op.total != pool.current_serving + pool.warm_ready
        pool.apply(now, d_sim.serving, d_sim.warm)
    assert decisions > 5  # the run scaled (the comparison covered changes, not a flat line)
    assert autoscaler.state == policy.autoscaler.state


def test_cold_start_in_status_is_the_one_the_lead_time_plans_with():
    # Defect (issue 15): status.coldStartSeconds was a nearest-rank p90 (40 s here), the lead time a
    # linear one (37 s): the two must be the same number.
    config = policy_config(SPEC)
    samples = (10.0, 20.0, 30.0, 40.0)
    assert planned_cold_start_s(config, samples) + config.decision_interval_s + config.signal_lag_s == pytest.approx(
        lead_time_s(config, samples))
    assert planned_cold_start_s(config, ()) is None
