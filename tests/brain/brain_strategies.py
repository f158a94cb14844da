"""Hypothesis strategies for the scaling brain: configurations, observations, forecasts, bad inputs."""

from __future__ import annotations

import math

from hypothesis import strategies as st
from preheat.scaling.policy import Observation, PolicyConfig

# Signal values as they really arrive: good numbers, zeros, and every kind of broken one.
BAD_VALUES = st.sampled_from([None, math.nan, math.inf, -math.inf, -1.0, -1e-9, -1e300])
GOOD_VALUES = st.one_of(
    st.just(0.0),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
)
ANY_VALUES = st.one_of(GOOD_VALUES, BAD_VALUES)


@st.composite
def configs(draw: st.DrawFn) -> PolicyConfig:
    max_replicas = draw(st.integers(1, 60))
    min_replicas = draw(st.integers(0, max_replicas))
    warm_pool_max = draw(st.integers(0, 8))
    warm_pool_min = draw(st.integers(0, warm_pool_max))
    stable = draw(st.floats(6.0, 300.0))
    return PolicyConfig(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_per_replica=draw(st.floats(0.01, 1e4)),
        target_utilization=draw(st.floats(0.1, 1.0)),
        decision_interval_s=draw(st.sampled_from([1.0, 2.0, 15.0, 30.0, 60.0])),
        forecasting=draw(st.booleans()),
        quantile=draw(st.floats(0.5, 0.99)),
        margin_in_serving=draw(st.booleans()),
        stable_window_s=stable,
        panic_window_s=draw(st.floats(1.0, stable)),
        panic_threshold=draw(st.floats(1.1, 5.0)),
        scale_down_stabilization_s=draw(st.sampled_from([0.0, 60.0, 300.0, None])),
        max_scale_down_rate=draw(st.floats(1.0, 10.0)),
        warm_pool_min=warm_pool_min,
        warm_pool_max=warm_pool_max,
        scale_to_zero=draw(st.booleans()),
        scale_to_zero_grace_s=draw(st.sampled_from([0.0, 30.0, 600.0])),
        default_cold_start_s=draw(st.floats(0.0, 600.0)),
        concurrency_per_replica=draw(st.one_of(st.none(), st.floats(0.5, 64.0))),
        queue_cold_start_rate=draw(st.sampled_from([0.0, 0.0, 1.0, 3.0, 1e6])),
        burst_memory_s=draw(st.sampled_from([0.0, 0.0, 60.0, 300.0])),
        burst_threshold=draw(st.floats(1.0, 3.0)),
        panic_interval_s=draw(st.sampled_from([None, 3.0])),
    )


@st.composite
def observations(draw: st.DrawFn, time_s: float, value=ANY_VALUES) -> Observation:
    return Observation(
        time_s=time_s,
        value=draw(value),
        value_panic=draw(st.one_of(st.none(), ANY_VALUES)),
        stale=draw(st.sampled_from([False, False, False, True])),
        serving_ready=draw(st.integers(0, 80)),
        warm_ready=draw(st.integers(0, 10)),
        starting=draw(st.integers(0, 10)),
        current_serving=draw(st.integers(0, 80)),
        cold_start_samples_s=tuple(draw(st.lists(st.one_of(st.floats(0.0, 900.0), BAD_VALUES.filter(
            lambda v: v is not None)), max_size=6))),
        queue=draw(st.one_of(st.none(), ANY_VALUES)),
        running=draw(st.one_of(st.none(), ANY_VALUES)),
    )


@st.composite
def observation_runs(draw: st.DrawFn, max_size: int = 15) -> list[Observation]:
    """A run of observations with non-decreasing (sometimes repeated) decision times."""
    n = draw(st.integers(1, max_size))
    t = draw(st.floats(0.0, 1e6))
    out = []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 1.0, 6.0, 15.0, 60.0, 301.0, 3600.0]))
        out.append(draw(observations(t)))
    return out


forecasts = st.one_of(st.none(), ANY_VALUES)
