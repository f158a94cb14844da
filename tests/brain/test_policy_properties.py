"""Property tests of the pure policy: bounds, panic, monotone in the forecast, bad input gives hold."""

from __future__ import annotations

import math

from brain_strategies import (
    ANY_VALUES,
    BAD_VALUES,
    GOOD_VALUES,
    configs,
    forecasts,
    observation_runs,
    observations,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from preheat.scaling.policy import (
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
    Reason,
    decide,
    decide_panic,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(config: PolicyConfig, obs_list: list[Observation], fcs: list) -> tuple[list[Decision], list[PolicyState]]:
    """Feed a run through decide; return every decision and the state before each one."""
    state = PolicyState()
    decisions, states = [], []
    for obs, (fv, fu) in zip(obs_list, fcs, strict=False):
        states.append(state)
        d, state = decide(config, state, obs, fv, fu)
        decisions.append(d)
    return decisions, states


def assert_within_bounds(config: PolicyConfig, d: Decision) -> None:
    assert isinstance(d.serving, int) and isinstance(d.warm, int)
    assert 0 <= d.serving <= config.max_replicas
    assert d.serving >= config.min_replicas
    if d.serving == 0:
        assert config.scale_to_zero, d.detail
        assert d.warm == 0
    else:
        assert d.serving >= max(config.min_replicas, 1)
    assert 0 <= d.warm <= config.warm_pool_max
    assert d.total == d.serving + d.warm <= config.max_replicas
    assert isinstance(d.reason, Reason) and d.detail
    assert math.isfinite(d.lead_time_s) and d.lead_time_s >= 0


@SETTINGS
@given(config=configs(), data=st.data())
def test_within_bounds_and_never_below_current_in_panic(config: PolicyConfig, data: st.DataObject) -> None:
    """Over random runs (good, broken and stale samples, repeated times): bounds always hold, the
    warm pool keeps its minimum where room allows, and panic never goes below current serving."""
    obs_list = data.draw(observation_runs())
    fcs = data.draw(st.lists(st.tuples(forecasts, forecasts), min_size=len(obs_list), max_size=len(obs_list)))
    decisions, _ = run(config, obs_list, fcs)
    for obs, d in zip(obs_list, decisions, strict=True):
        assert_within_bounds(config, d)
        if d.serving > 0 and d.reason != Reason.HOLD:
            assert d.warm >= min(config.warm_pool_min, config.max_replicas - d.serving), d.detail
        if d.panic:
            assert d.serving >= min(obs.current_serving, config.max_replicas), d.detail


@SETTINGS
@given(config=configs(), current=st.integers(1, 20), data=st.data())
def test_a_burst_enters_panic_and_panic_never_scales_down(config: PolicyConfig, current: int, data: st.DataObject) -> None:
    """A short-window burst >= threshold x current panics; later smaller signals cannot shrink serving."""
    cap = config.capacity_per_replica
    burst = config.panic_threshold * current * cap * data.draw(st.floats(1.0, 3.0))
    state = PolicyState(last_serving=current)
    obs = Observation(time_s=1000.0, value=0.0, value_panic=burst, current_serving=current)
    d, state = decide(config, state, obs)
    assert d.panic
    assert d.serving >= min(current, config.max_replicas)
    # the burst fades within the stable window: still panic, still no scale-down
    later = Observation(time_s=1000.0 + config.stable_window_s / 2, value=0.0, value_panic=0.0,
                        current_serving=d.serving)
    d2, _ = decide(config, state, later)
    assert d2.panic
    assert d2.serving >= d.serving or d2.serving == config.max_replicas


@SETTINGS
@given(config=configs(), data=st.data(), f1=GOOD_VALUES, f2=GOOD_VALUES, u1=GOOD_VALUES, u2=GOOD_VALUES)
def test_monotone_in_the_forecast(config: PolicyConfig, data: st.DataObject, f1: float, f2: float,
                                  u1: float, u2: float) -> None:
    """A higher forecast (point and upper) never gives fewer serving replicas or a smaller Deployment."""
    warmup = data.draw(observation_runs(max_size=8))
    warm_fcs = data.draw(st.lists(st.tuples(forecasts, forecasts), min_size=len(warmup), max_size=len(warmup)))
    _, states = run(config, warmup, warm_fcs)
    state = states[-1]
    obs = data.draw(observations(warmup[-1].time_s + 15.0))
    lo_f, hi_f = sorted((f1, f2))
    lo_u, hi_u = sorted((u1, u2))
    d_lo, _ = decide(config, state, obs, lo_f, lo_u)
    d_hi, _ = decide(config, state, obs, hi_f, hi_u)
    assert d_hi.serving >= d_lo.serving, (d_lo.detail, d_hi.detail)
    assert d_hi.total >= d_lo.total, (d_lo.detail, d_hi.detail)
    # and no forecast at all is never more than a forecast of anything
    d_none, _ = decide(config, state, obs, None, None)
    assert d_lo.serving >= d_none.serving


@SETTINGS
@given(config=configs(), data=st.data(), bad=BAD_VALUES, forecast_value=forecasts)
def test_bad_or_stale_input_holds_and_never_raises(config: PolicyConfig, data: st.DataObject, bad,
                                                   forecast_value) -> None:
    warmup = data.draw(observation_runs(max_size=8))
    _, states = run(config, warmup, [(None, None)] * len(warmup))
    state = states[-1]
    prev = state.last_serving if state.last_serving is not None else 0
    t = warmup[-1].time_s + 15.0
    stale_good = data.draw(observations(t, value=GOOD_VALUES))
    cases = [
        Observation(time_s=t, value=bad, current_serving=stale_good.current_serving),
        Observation(time_s=t, value=None),  # empty: nothing known at all
        Observation(time_s=math.nan, value=5.0, current_serving=3),
        Observation(time_s=t, value=stale_good.value, stale=True, current_serving=stale_good.current_serving),
    ]
    for obs in cases:
        d, new_state = decide(config, state, obs, None, None)
        assert d.reason in (Reason.HOLD, Reason.BOUNDS), d.detail
        assert_within_bounds(config, d)
        floor = min(max(prev, obs.current_serving), config.max_replicas)
        assert d.serving >= floor, d.detail  # never scales down on missing data
        assert new_state.serving_recommendations == state.serving_recommendations
        # with a forecast the only other outcome is a forecast-driven scale-up
        d_f, _ = decide(config, state, obs, forecast_value, forecast_value)
        assert d_f.reason in (Reason.HOLD, Reason.BOUNDS, Reason.FORECAST)
        assert d_f.serving >= d.serving


@SETTINGS
@given(config=configs(), data=st.data(), value=ANY_VALUES, fv=forecasts, fu=forecasts)
def test_decide_is_pure(config: PolicyConfig, data: st.DataObject, value, fv, fu) -> None:
    warmup = data.draw(observation_runs(max_size=6))
    _, states = run(config, warmup, [(None, None)] * len(warmup))
    state = states[-1]
    obs = Observation(time_s=warmup[-1].time_s + 15.0, value=value, current_serving=2)
    a = decide(config, state, obs, fv, fu)
    b = decide(config, state, obs, fv, fu)
    assert a == b
    assert PolicyState.from_dict(a[1].to_dict()) == a[1]
    assert Decision.from_dict(a[0].to_dict()) == a[0]


@SETTINGS
@given(config=configs(), data=st.data())
def test_fast_panic_path_only_promotes_within_bounds_and_never_raises(config: PolicyConfig, data: st.DataObject) -> None:
    """Between full decisions the fast path either does nothing or moves Ready warm replicas to
    serving: the Deployment's total never grows, serving never shrinks, bounds hold, and missing,
    broken or stale gauges do nothing."""
    obs_list = data.draw(observation_runs(max_size=8))
    fcs = data.draw(st.lists(st.tuples(forecasts, forecasts), min_size=len(obs_list), max_size=len(obs_list)))
    state = PolicyState()
    for obs, (fv, fu) in zip(obs_list, fcs, strict=False):
        d, state = decide(config, state, obs, fv, fu)
        fast, after = decide_panic(config, state, obs)
        if fast is None:
            assert after == state
            continue
        assert config.concurrency_per_replica is not None and not obs.stale
        assert fast.reason == Reason.PANIC and fast.panic
        assert fast.total <= d.total and fast.total <= config.max_replicas
        assert fast.serving > d.serving and 0 <= fast.warm <= d.warm
        current = obs.current_serving if isinstance(obs.current_serving, int) else 0
        assert 0 < fast.promote <= obs.warm_ready
        assert fast.serving <= max(d.serving, current) + obs.warm_ready
        assert PolicyState.from_dict(after.to_dict()) == after
        state = after
