"""Unit tests of each policy term: lead time, reactive/forecast needs, panic, stabilization, warm
pool, scale to zero, hold, no double counting of starting pods, configuration errors."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from preheat.scaling.policy import (
    Observation,
    PolicyConfig,
    PolicyState,
    Reason,
    cold_start_s,
    decide,
    decide_panic,
    hold_lead_times,
    lead_time_s,
    noise_sigma,
    quantile,
    replicas_needed,
    stabilization_window_s,
)

# One replica carries 10 signal units at full utilization: needs are easy to read.
# Warm replicas at a fifth of a serving one's cost, below what one is worth with the default 60 s cold
# start (lead 120 s, reaction 90 s: 0.25 of a serving replica): the forecast's margin waits warm.
BASE = PolicyConfig(min_replicas=1, max_replicas=50, target_per_replica=10.0, target_utilization=1.0,
                    decision_interval_s=15.0, warm_pool_min=0, warm_pool_max=0, warm_cost_fraction=0.2)


def obs(t: float, value: float | None, current: int, **kw) -> Observation:
    return Observation(time_s=t, value=value, current_serving=current, serving_ready=current, **kw)


def steps(config: PolicyConfig, values, current: int, t0: float = 0.0, dt: float = 15.0, follow: bool = True,
          forecast=None):
    """Decide on a list of signal values; `follow` makes current serving follow each decision."""
    state, out = PolicyState(), []
    for i, v in enumerate(values):
        fv = forecast[i] if forecast is not None else None
        d, state = decide(config, state, obs(t0 + i * dt, v, current), fv, fv)
        out.append(d)
        if follow:
            current = d.serving
    return out, state


def test_lead_time_is_p90_cold_start_plus_interval() -> None:
    samples = [float(s) for s in range(10, 110, 10)]  # 10..100 s
    p90 = quantile(samples, 0.9)
    assert p90 == pytest.approx(sorted(samples)[8] + 0.1 * (sorted(samples)[9] - sorted(samples)[8]))
    lag = BASE.stable_window_s / 2 + BASE.scrape_interval_s  # the signal's own lag
    assert BASE.signal_lag_s == lag
    assert lead_time_s(BASE, samples) == pytest.approx(p90 + BASE.decision_interval_s + lag)
    # until measured: the default cold start
    assert lead_time_s(BASE, []) == BASE.default_cold_start_s + BASE.decision_interval_s + lag
    # bad samples are ignored, not propagated
    assert cold_start_s(BASE, [math.nan, -5.0, 40.0]) == 40.0
    assert lead_time_s(BASE.with_(horizon_override_s=600.0), samples) == 600.0
    # the decision reports the lead time it planned for, and remembers measured samples
    d, state = decide(BASE, PolicyState(), obs(0, 10.0, 1, cold_start_samples_s=tuple(samples)))
    assert d.lead_time_s == pytest.approx(p90 + 15.0 + lag)
    d2, _ = decide(BASE, state, obs(15, 10.0, 1))
    assert d2.lead_time_s == pytest.approx(p90 + 15.0 + lag)


def test_reactive_need_is_signal_over_capacity_at_target_utilization() -> None:
    assert replicas_needed(95.0, BASE) == 10
    assert replicas_needed(100.0, BASE) == 10  # exactly full, not 11
    assert replicas_needed(0.30000000000000004 * 1000, BASE.with_(target_per_replica=30.0)) == 10
    assert replicas_needed(100.0, BASE.with_(target_utilization=0.5)) == 20
    assert replicas_needed(0.0, BASE) == 0
    d, _ = decide(BASE, PolicyState(), obs(0, 95.0, 10))
    assert (d.serving, d.reason, d.reactive_need) == (10, Reason.REACTIVE, 10)


def test_forecast_term_wins_when_higher_and_names_itself() -> None:
    d, _ = decide(BASE, PolicyState(), obs(0, 40.0, 4), forecast_value=120.0, forecast_upper=150.0)
    assert d.serving == 12 and d.reason == Reason.FORECAST and d.forecast_need == 12
    assert "forecast" in d.detail and "120" in d.detail
    # forecasting switched off: the forecast is ignored
    d_off, _ = decide(BASE.with_(forecasting=False), PolicyState(), obs(0, 40.0, 4), 120.0, 150.0)
    assert d_off.serving == 4 and d_off.reason == Reason.REACTIVE
    # a lower forecast never lowers the reactive need
    d_low, _ = decide(BASE, PolicyState(), obs(0, 40.0, 4), 5.0, 5.0)
    assert d_low.serving == 4 and d_low.reason == Reason.REACTIVE


def test_margin_in_serving_uses_the_upper_forecast() -> None:
    cfg = BASE.with_(margin_in_serving=True, warm_pool_max=5)
    d, _ = decide(cfg, PolicyState(), obs(0, 40.0, 4), forecast_value=100.0, forecast_upper=150.0)
    assert d.serving == 15 and d.warm == 0


def test_scale_down_waits_for_the_stabilization_window_then_respects_max_rate() -> None:
    cfg = BASE.with_(scale_down_stabilization_s=300.0, max_scale_down_rate=2.0)
    values = [200.0] * 4 + [10.0] * 40  # 20 replicas, then traffic for 1
    decisions, _ = steps(cfg, values, current=20)
    after_drop = decisions[4:]
    # held at 20 for the whole window (the 200-signal recommendation is < 300 s old)
    held = [d for d in after_drop if d.time_s - 45.0 < 300.0]
    assert all(d.serving == 20 and d.reason == Reason.STABILIZATION for d in held)
    # then scale down, at most halving per decision (floor, as Knative): 20 -> 10 -> 5 -> 2 -> 1
    later = [d.serving for d in after_drop if d.time_s - 45.0 >= 300.0]
    assert later[:5] == [10, 5, 2, 1, 1]
    assert any("max scale-down rate" in d.detail for d in after_drop)


def _serving_on_a_ramp_down(cfg: PolicyConfig, seasonal: bool = False) -> int:
    """Serving after 15 minutes of a steady ramp down (400 - 3 per 15 s, the forecast following the
    signal): with the window's hold, the need of the signal one window ago."""
    state, current = PolicyState(), 40
    for i in range(61):
        v = 400.0 - 3.0 * i
        d, state = decide(cfg, state, obs(i * 15.0, v, current), v, v, seasonal=seasonal)
        current = d.serving
    assert d.reason == Reason.STABILIZATION
    return current


def test_forecasting_holds_two_lead_times_and_the_noise_floor_replaces_hpas_300s() -> None:
    """The window is two lead times when forecasting; HPA's 300 s floor under it only where the noise
    floor is off. A steady ramp's drop (no noise around its line) is given back after two lead times."""
    lead = lead_time_s(BASE, [])  # default 60 s cold start + interval + the signal's lag = 120 s
    assert 2.0 * lead < 300.0 and BASE.scale_down_noise_sigmas == 3.0
    assert stabilization_window_s(BASE, lead) == 2.0 * lead
    off = BASE.with_(scale_down_noise_sigmas=0.0)
    assert stabilization_window_s(off, lead) == 300.0
    assert stabilization_window_s(BASE.with_(trend_window_s=0.0), lead) == 300.0  # no samples to test
    assert stabilization_window_s(BASE.with_(forecasting=False), lead) == 300.0
    assert stabilization_window_s(BASE, 360.0) == stabilization_window_s(off, 360.0) == 720.0
    assert stabilization_window_s(BASE.with_(horizon_override_s=10.0), 10.0) == BASE.stable_window_s
    # on a steady ramp (its samples lie on their line: no noise) the hold is two lead times, not 300 s
    assert _serving_on_a_ramp_down(BASE) == replicas_needed(400.0 - 3.0 * (60 - 2.0 * lead / 15.0), BASE) == 27
    assert _serving_on_a_ramp_down(off) == replicas_needed(400.0 - 3.0 * (60 - 300.0 / 15.0), BASE) == 28


def test_the_more_headroom_the_user_buys_the_longer_a_replica_is_held() -> None:
    """The window is 1 + 1/U lead times: two at U = 1, three at U = 0.5 (demand a replica cannot serve
    while it comes back is priced at the 1/U replicas the user pays to serve it safely)."""
    lead = lead_time_s(BASE, [])
    half = BASE.with_(target_utilization=0.5, max_replicas=100)
    assert hold_lead_times(BASE) == 2.0 and hold_lead_times(half) == 3.0
    assert stabilization_window_s(half, lead) == 3.0 * lead
    assert stabilization_window_s(half.with_(scale_down_noise_sigmas=0.0), 360.0) == 3.0 * 360.0
    assert stabilization_window_s(half.with_(scale_down_stabilization_s=60.0), lead) == 60.0  # as configured
    # on the same steady ramp down, at U = 0.5 serving is what the signal needed (at twice the replicas)
    # at the oldest decision still in the window: 23 decisions of 15 s ago (the one exactly three lead
    # times old has left it), not 15 as at U = 1
    assert _serving_on_a_ramp_down(half) == replicas_needed(400.0 - 3.0 * (60 - 3.0 * lead / 15.0 + 1), half) == 58
    assert _serving_on_a_ramp_down(half.with_(target_utilization=1.0)) == 27


def test_once_the_season_is_learned_a_replica_is_held_one_lead_time() -> None:
    """With its season the forecast orders demand that comes back with the season a lead time ahead, so
    getting a replica back costs its start-up only: the window is one lead time at every U (at least
    the stable window; a configured window is that window), not 1 + 1/U lead times."""
    lead = lead_time_s(BASE, [])
    half = BASE.with_(target_utilization=0.5, max_replicas=100)
    assert hold_lead_times(BASE, seasonal=True) == hold_lead_times(half, seasonal=True) == 1.0
    assert stabilization_window_s(half, lead, seasonal=True) == lead
    assert stabilization_window_s(half, 360.0, seasonal=True) == 360.0
    assert stabilization_window_s(BASE, 10.0, seasonal=True) == BASE.stable_window_s
    assert stabilization_window_s(half.with_(scale_down_stabilization_s=60.0), lead, seasonal=True) == 60.0
    assert stabilization_window_s(BASE.with_(forecasting=False), lead, seasonal=True) == 300.0
    # on the steady ramp down serving is the need of the decision one lead time (8 decisions) ago, not
    # two (at U = 1) or three (at U = 0.5)
    at_one = replicas_needed(400.0 - 3.0 * (60 - lead / 15.0 + 1), BASE)
    assert _serving_on_a_ramp_down(BASE, seasonal=True) == at_one == 25 < _serving_on_a_ramp_down(BASE)
    assert _serving_on_a_ramp_down(half, seasonal=True) == replicas_needed(400.0 - 3.0 * (60 - lead / 15.0 + 1),
                                                                           half) == 49


def test_the_noise_floor_holds_a_dip_within_the_noise_and_gives_back_a_drop_beyond_it() -> None:
    """No recommendation in the window is above the new need; what decides is the signal's recent noise."""
    def after(history: list[float], value: float, cfg: PolicyConfig = BASE):
        # The samples of the last few minutes, one every 15 s up to now; no recommendation in the window.
        t = 1000.0
        recent = tuple((t - 15.0 * (len(history) - i), v) for i, v in enumerate(history))
        state = PolicyState(last_serving=14, recent_signal=recent, last_data_s=t - 15.0)
        return decide(cfg, state, obs(t, value, 14), value, value)[0]

    noisy = [100.0 + (40.0 if i % 2 else -40.0) for i in range(19)]  # sigma about 41 around the line
    held = after(noisy, 90.0)
    assert held.serving == 14 and held.reason == Reason.STABILIZATION, held.detail
    assert "within 3 sigma" in held.detail
    assert after(noisy, 90.0, BASE.with_(scale_down_noise_sigmas=0.0)).serving == 9  # off: the need
    # a configured window is exactly that window (HPA's semantics): no noise floor under it
    assert after(noisy, 90.0, BASE.with_(scale_down_stabilization_s=60.0)).serving == 9
    quiet = [100.0 + (1.0 if i % 2 else -1.0) for i in range(19)]  # sigma about 1: 90 + 3 is beyond it
    assert after(quiet, 90.0).serving == 10
    assert after([200.0 - 6.0 * i for i in range(19)], 86.0).serving == 9  # on a clean ramp's line: no noise
    assert noise_sigma([(0.0, 1.0), (15.0, 2.0), (30.0, 3.0)]) == 0.0  # a line is not noise
    assert noise_sigma([(0.0, 5.0), (15.0, 5.0)]) == 0.0  # too few samples to say


def test_scale_up_is_immediate() -> None:
    cfg = BASE.with_(scale_down_stabilization_s=300.0)
    decisions, _ = steps(cfg, [10.0, 10.0, 300.0], current=1)
    assert decisions[-1].serving == 30


def test_panic_on_a_burst_holds_through_the_stable_window_then_leaves() -> None:
    cfg = BASE.with_(stable_window_s=60.0, panic_threshold=2.0, scale_down_stabilization_s=0.0)
    state = PolicyState()
    d, state = decide(cfg, state, obs(0, 40.0, 4))
    assert not d.panic
    # short-window burst: 100 needs 10 >= 2 x 4 serving -> panic, scale to the panic need
    d, state = decide(cfg, state, Observation(time_s=15, value=45.0, value_panic=100.0, current_serving=4))
    assert d.panic and d.serving == 10 and d.reason == Reason.PANIC
    # burst gone, but within the stable window: no scale-down
    d, state = decide(cfg, state, obs(45, 20.0, 10))
    assert d.panic and d.serving == 10
    # a stable window after the last over-threshold sample: panic ends, normal scale-down resumes
    d, state = decide(cfg, state, obs(76, 20.0, 10))
    assert not d.panic and d.serving == 5


def test_missing_or_stale_data_holds_and_never_scales_down() -> None:
    _, state = steps(BASE, [80.0], current=8)
    for bad in (None, math.nan, -3.0, math.inf):
        d, _ = decide(BASE, state, obs(30, bad, 8))
        assert d.serving == 8 and d.reason == Reason.HOLD, d.detail
    d, _ = decide(BASE, state, obs(30, 1.0, 8, stale=True))
    assert d.serving == 8 and d.reason == Reason.HOLD and "stale" in d.detail
    # the forecast still pre-scales while metrics are down (but nothing ever scales down)
    d, _ = decide(BASE, state, obs(30, None, 8), forecast_value=150.0, forecast_upper=150.0)
    assert d.serving == 15 and d.reason == Reason.FORECAST



def test_a_data_gap_does_not_age_the_stabilization_window() -> None:
    """After a metrics outage the fleet keeps its size for a full window of fresh, lower data."""
    cfg = BASE.with_(scale_down_stabilization_s=300.0, max_scale_down_rate=2.0)
    _, state = steps(cfg, [200.0] * 4, current=20)  # t = 0..45: 20 replicas
    # an hour without data: holds, and the windows do not advance
    for t in range(60, 3660, 15):
        d, state = decide(cfg, state, obs(t, None, 20))
        assert d.serving == 20 and d.reason == Reason.HOLD
    # data returns, much lower (a partial window after the outage): still 20 for 300 s of fresh data
    resumed = 3660.0
    fresh = []
    for k in range(30):
        d, state = decide(cfg, state, obs(resumed + 15 * k, 10.0, d.serving))
        fresh.append(d)
    held = [d for d in fresh if d.time_s - resumed < 300.0 - 15.0]
    assert held and all(d.serving == 20 and d.reason == Reason.STABILIZATION for d in held), [
        (d.time_s, d.serving, d.detail) for d in held]
    # then the normal scale-down: halving per decision, down to what the signal needs
    assert [d.serving for d in fresh[len(held):]][:5] == [10, 5, 2, 1, 1]
    # without the gap the same recommendations would have expired long ago
    no_gap = PolicyState(last_serving=20, serving_recommendations=((45.0, 20),), last_data_s=3645.0)
    d, _ = decide(cfg, no_gap, obs(resumed, 10.0, 20))
    assert d.serving == 10

def test_starting_pods_are_not_counted_twice() -> None:
    """4 labelled serving (2 Ready, 2 starting) and a signal needing 4: desired stays 4 (no 2->4->8)."""
    cfg = BASE.with_(panic_threshold=2.0)
    state = PolicyState()
    for i in range(10):
        o = Observation(time_s=15.0 * i, value=40.0, current_serving=4, serving_ready=2, starting=2)
        d, state = decide(cfg, state, o)
        assert d.serving == 4


def test_warm_pool_is_minimum_plus_forecast_burst_margin_within_limits() -> None:
    cfg = BASE.with_(warm_pool_min=1, warm_pool_max=4, max_replicas=20)
    # point forecast needs 10, upper needs 13: warm = 1 + 3
    d, _ = decide(cfg, PolicyState(), obs(0, 50.0, 5), forecast_value=100.0, forecast_upper=130.0)
    assert (d.serving, d.warm, d.total) == (10, 4, 14)
    # the extra is capped by warm_pool_max
    d, _ = decide(cfg, PolicyState(), obs(0, 50.0, 5), forecast_value=100.0, forecast_upper=300.0)
    assert d.warm == 4
    # and by max_replicas - serving (max_replicas bounds the Deployment)
    d, _ = decide(cfg, PolicyState(), obs(0, 190.0, 19), forecast_value=190.0, forecast_upper=300.0)
    assert (d.serving, d.warm) == (19, 1)
    d, _ = decide(cfg, PolicyState(), obs(0, 250.0, 19))
    assert (d.serving, d.warm, d.reason) == (20, 0, Reason.BOUNDS)
    # no forecast: just the minimum
    d, _ = decide(cfg, PolicyState(), obs(0, 50.0, 5))
    assert d.warm == 1


def test_growing_the_warm_pool_alone_is_named_warm_pool_and_promotions_are_counted() -> None:
    cfg = BASE.with_(warm_pool_min=1, warm_pool_max=4)
    d, state = decide(cfg, PolicyState(), obs(0, 50.0, 5), 50.0, 50.0)
    assert (d.serving, d.warm) == (5, 1)
    d, state = decide(cfg, state, obs(15, 50.0, 5), 50.0, 80.0)
    assert (d.serving, d.warm, d.reason) == (5, 4, Reason.WARM_POOL)
    # a rise of 3 with 2 warm pods Ready: promote 2, cold-start the rest
    d, _ = decide(cfg, state, Observation(time_s=30, value=80.0, current_serving=5, warm_ready=2))
    assert d.serving == 8 and d.promote == 2


def test_freed_serving_replicas_are_held_serving_for_the_window_then_deleted_not_held_warm_again() -> None:
    """A replica freed from serving has been held there for the scale-down window, ski rental's rent for
    one re-buy; a cheaper warm pool does not hold it a second window (that cost 0.5-2 % more for the
    same SLO at 300 s). Without a forecast margin or a queue the decisions are those at full price."""
    cfg = BASE.with_(warm_pool_min=0, warm_pool_max=4, scale_down_stabilization_s=60.0, max_scale_down_rate=10.0)
    assert cfg.warm_pays(lead_time_s(cfg, ()))  # the warm pool pays here: the test is not vacuous
    values = [100.0] * 2 + [50.0] * 12
    decisions, _ = steps(cfg, values, current=10)
    first_down = next(d for d in decisions if d.serving < 10)
    assert first_down.time_s - 15.0 >= 60.0  # held serving for the whole window after the drop
    assert (first_down.serving, first_down.warm) == (5, 0)  # then deleted, not demoted
    full, _ = steps(cfg.with_(warm_cost_fraction=1.0), values, current=10)
    assert [(d.serving, d.warm) for d in decisions] == [(d.serving, d.warm) for d in full]


def test_scale_to_zero_after_grace_unless_traffic_is_forecast() -> None:
    cfg = BASE.with_(min_replicas=0, scale_to_zero=True, scale_to_zero_grace_s=60.0,
                     scale_down_stabilization_s=0.0, warm_pool_min=1, warm_pool_max=2)
    decisions, state = steps(cfg, [20.0] + [0.0] * 8, current=2)
    grace = [d for d in decisions[1:] if d.time_s - 15.0 < 60.0]
    assert all(d.serving == 1 for d in grace)  # keep one replica during the grace
    final = decisions[-1]
    assert (final.serving, final.warm, final.reason) == (0, 0, Reason.SCALE_TO_ZERO)
    # at zero, traffic wakes it up
    d, _ = decide(cfg, state, obs(200, 5.0, 0))
    assert d.serving >= 1
    # never to zero when the forecast says traffic comes within the lead time
    decisions, _ = steps(cfg, [20.0] + [0.0] * 8, current=2, forecast=[None] + [30.0] * 8)
    assert all(d.serving >= 1 for d in decisions)
    assert decisions[-1].reason == Reason.FORECAST
    # scale to zero disabled: the floor is one replica
    decisions, _ = steps(cfg.with_(scale_to_zero=False), [20.0] + [0.0] * 8, current=2)
    assert decisions[-1].serving == 1


def test_at_zero_the_activator_count_wakes_the_endpoint_without_a_season() -> None:
    """At zero pods the activator counts the requests it holds, so the observation stays fresh: zero
    traffic keeps the endpoint at zero, the first requests wake it, and no forecaster season is needed
    to go down (the forecast alone no longer has to bring it back)."""
    cfg = BASE.with_(min_replicas=0, scale_to_zero=True, scale_to_zero_grace_s=60.0, scale_down_stabilization_s=0.0)
    state, current, d = PolicyState(), 2, None
    for i, v in enumerate([20.0] + [0.0] * 8):
        d, state = decide(cfg, state, obs(i * 15.0, v, current), 0.0, 0.0, ready=False)
        current = d.serving
    assert (d.serving, d.reason) == (0, Reason.SCALE_TO_ZERO)
    quiet, state = decide(cfg, state, obs(150.0, 0.0, 0), 0.0, 0.0, ready=False)
    assert quiet.serving == 0
    woken, _ = decide(cfg, state, obs(165.0, 0.2, 0), 0.0, 0.0, ready=False)
    assert woken.serving >= 1 and woken.reason == Reason.REACTIVE


def test_at_zero_the_forecast_wakes_the_endpoint_by_the_test_that_put_it_there() -> None:
    """At zero pods with no data (Prometheus down: a stale observation) a forecast of a sliver of a replica
    (below the idle fraction that allowed zero) must not wake one: its first fresh sample is zero and it
    goes straight back (it flapped every other decision in the simulator); a real forecast wakes it."""
    cfg = BASE.with_(min_replicas=0, scale_to_zero=True, scale_to_zero_grace_s=60.0, scale_down_stabilization_s=0.0)
    state, current = PolicyState(), 2
    for i, v in enumerate([20.0] + [0.0] * 8):
        d, state = decide(cfg, state, obs(i * 15.0, v, current), 0.0, 0.0)
        current = d.serving
    assert d.serving == 0
    idle = 0.5 * cfg.idle_forecast_fraction * cfg.capacity_per_replica
    stale = Observation(time_s=150.0, value=None, stale=True, current_serving=0)
    asleep, _ = decide(cfg, state, stale, idle, idle)
    assert (asleep.serving, asleep.reason) == (0, Reason.HOLD)
    coming = 2.0 * cfg.capacity_per_replica
    awake, _ = decide(cfg, state, stale, coming, coming)
    assert awake.serving >= 2 and awake.reason == Reason.FORECAST


def test_bounds_clamp_and_are_named() -> None:
    cfg = BASE.with_(min_replicas=3, max_replicas=6)
    d, _ = decide(cfg, PolicyState(), obs(0, 1.0, 3))
    assert (d.serving, d.reason) == (3, Reason.BOUNDS)
    d, _ = decide(cfg, PolicyState(), obs(0, 1000.0, 3))
    assert (d.serving, d.reason) == (6, Reason.BOUNDS)
    assert "clamped" in d.detail


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "min_replicas (5) exceeds max_replicas (2)"),
        ({"target_per_replica": 0.0}, "target_per_replica must be > 0"),
        ({"target_utilization": 1.5}, "target_utilization must be <= 1"),
        ({"quantile": 1.0}, "quantile must be strictly between 0 and 1"),
        ({"warm_pool_min": 3, "warm_pool_max": 1}, "warm_pool_min (3) exceeds warm_pool_max (1)"),
        ({"panic_threshold": 1.0}, "panic_threshold must be > 1"),
        ({"max_scale_down_rate": math.nan}, "max_scale_down_rate must be a finite number"),
        ({"min_replicas": -1}, "min_replicas must be a non-negative integer"),
        ({"concurrency_per_replica": 0.0}, "concurrency_per_replica must be None or a positive number"),
        ({"queue_cold_start_rate": -1.0}, "queue_cold_start_rate must be >= 0"),
        ({"burst_memory_s": -1.0}, "burst_memory_s must be >= 0"),
        ({"burst_threshold": 0.5}, "burst_threshold must be >= 1"),
        ({"panic_interval_s": 0.0}, "panic_interval_s must be None or a positive number"),
    ],
)
def test_invalid_config_is_rejected_with_the_reason(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match="invalid PolicyConfig") as err:
        BASE.with_(**changes)
    assert message in str(err.value)


def test_config_round_trip_and_unknown_fields() -> None:
    cfg = BASE.with_(warm_pool_max=3)
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown PolicyConfig fields: bogus"):
        PolicyConfig.from_dict({**cfg.to_dict(), "bogus": 1})


# Concurrency counts (vllm:num_requests_running / _waiting): one replica has 4 slots.
SLOTS = BASE.with_(concurrency_per_replica=4.0, warm_pool_max=5)


def test_a_queue_promotes_the_warm_pool_before_any_rate_moves() -> None:
    # 4 serving replicas, slots full (16 running) and 10 waiting; the 60 s rate still says 2 replicas.
    d, _ = decide(SLOTS, PolicyState(), obs(0.0, 20.0, 4, running=16.0, queue=10.0, warm_ready=2))
    assert d.panic and d.reason == Reason.PANIC
    # 26 requests need 7 replicas of 4 slots; the queue alone may only promote the 2 warm ones
    assert d.serving == 6 and d.promote == 2 and d.panic_need == 6
    assert "16 running + 10 waiting" in d.detail


def test_queue_promotions_return_to_the_warm_pool_after_the_panic_where_warm_is_cheaper() -> None:
    cfg = SLOTS.with_(scale_down_stabilization_s=600.0, max_scale_down_rate=10.0)

    def run(c: PolicyConfig) -> list:
        d, state = decide(c, PolicyState(), obs(0.0, 20.0, 4, running=16.0, queue=10.0, warm_ready=2))
        out = [d]
        for t in range(15, 181, 15):  # the queue is gone; the rates still need 2 replicas
            d, state = decide(c, state, obs(float(t), 20.0, d.serving, running=8.0, queue=0.0))
            out.append(d)
        return out

    cheap, full = run(cfg), run(cfg.with_(warm_cost_fraction=1.0))
    assert cheap[0].serving == full[0].serving == 6  # the queue promotes the 2 warm replicas
    # W < 1: once the panic is over (a stable window after the last queue), the 4 replicas the queue
    # needed go back to the warm pool (promoted again in seconds), the Deployment's total is kept
    after = [d for d in cheap if d.time_s >= 60.0]
    assert all(not d.panic and d.serving == 2 and d.total == 6 for d in after), [(d.serving, d.warm) for d in after]
    # W = 1: a warm replica costs what a serving one does, so they stay serving for the window
    assert all(d.serving == 6 for d in full)


def test_queue_cold_start_rate_lets_the_queue_order_cold_starts() -> None:
    cfg = SLOTS.with_(queue_cold_start_rate=1.0)
    d, _ = decide(cfg, PolicyState(), obs(0.0, 20.0, 4, running=16.0, queue=10.0, warm_ready=2))
    assert d.serving == 7 and d.reason == Reason.PANIC  # 2 promoted + 1 cold start (cap 4 + 2 + 4)
    many, _ = decide(cfg, PolicyState(), obs(0.0, 20.0, 4, running=16.0, queue=400.0, warm_ready=2))
    assert many.serving == 4 + 2 + 4  # capped at 1 cold start per serving replica


def test_no_queue_panic_while_slots_are_free_or_without_concurrency_config() -> None:
    # requests running but nobody waiting: the need is what runs now, no panic
    d, _ = decide(SLOTS, PolicyState(), obs(0.0, 20.0, 4, running=12.0, queue=0.0, warm_ready=2))
    assert not d.panic and d.serving == 2  # the stable signal's need (20 / 10): nothing is queued
    # the same queue without concurrency_per_replica is ignored (the signal alone decides)
    plain, _ = decide(BASE.with_(warm_pool_max=5), PolicyState(),
                      obs(0.0, 20.0, 4, running=16.0, queue=10.0, warm_ready=2))
    assert not plain.panic and plain.serving == 2 and plain.panic_need == 2


@pytest.mark.parametrize("bad", [None, math.nan, -3.0, math.inf])
def test_broken_queue_counts_are_read_as_zero(bad) -> None:
    d, _ = decide(SLOTS, PolicyState(), obs(0.0, 20.0, 4, running=bad, queue=bad, warm_ready=2))
    assert not d.panic and d.serving == 2


# Burst envelope: no stabilization window, so what holds the warm pool is the envelope alone.
BURSTY = SLOTS.with_(burst_memory_s=120.0, scale_down_stabilization_s=0.0, warm_pool_max=8)


def test_burst_envelope_holds_the_short_window_need_as_warm_pool_then_lapses() -> None:
    state, current = PolicyState(), 2
    # a burst: the short window needs 8 replicas while the stable window needs 2
    d, state = decide(BURSTY, state, obs(0.0, 20.0, current, value_panic=80.0))
    assert d.serving + d.warm >= 8
    current = d.serving
    held = []
    for t in (60.0, 75.0, 90.0, 105.0):  # quiet: 1 replica's worth, within the 120 s memory
        d, state = decide(BURSTY, state, obs(t, 5.0, current, value_panic=5.0))
        current = d.serving
        held.append(d)
    assert all(x.serving + x.warm >= 8 for x in held), [x.detail for x in held]
    assert any(x.reason == Reason.BURST for x in held)
    assert "burst envelope" in held[-1].detail
    # 120 s after the last burst sample the envelope has lapsed
    d, state = decide(BURSTY, state, obs(135.0, 5.0, current, value_panic=5.0))
    assert d.warm == 0 and d.serving == 1


def test_burst_envelope_is_off_by_default_and_ignores_smooth_traffic() -> None:
    cfg = BURSTY.with_(burst_memory_s=0.0)
    d, state = decide(cfg, PolicyState(), obs(0.0, 20.0, 2, value_panic=80.0))
    d, _ = decide(cfg, state, obs(60.0, 5.0, d.serving, value_panic=5.0))
    assert d.warm == 0
    # smooth traffic: the short window within burst_threshold of the stable one adds nothing
    d, state = decide(BURSTY, PolicyState(), obs(0.0, 40.0, 4, value_panic=50.0))
    d, _ = decide(BURSTY, state, obs(15.0, 40.0, d.serving, value_panic=40.0))
    assert d.warm == 0 and d.reason != Reason.BURST


def test_burst_envelope_respects_warm_pool_max_and_max_replicas() -> None:
    cfg = BURSTY.with_(warm_pool_max=3, max_replicas=6)
    d, state = decide(cfg, PolicyState(), obs(0.0, 20.0, 2, value_panic=400.0))
    d, _ = decide(cfg, state, obs(15.0, 5.0, d.serving, value_panic=5.0))
    assert d.warm <= 3 and d.total <= 6


FAST = SLOTS.with_(panic_interval_s=3.0)


def test_fast_panic_path_promotes_ready_warm_replicas_only() -> None:
    state = PolicyState(last_serving=4, last_warm=3)
    gauges = Observation(time_s=100.0, value=None, current_serving=4, serving_ready=4, warm_ready=3,
                         running=16.0, queue=6.0)
    d, new = decide_panic(FAST, state, gauges)
    assert d is not None and d.reason == Reason.PANIC and d.panic
    # 22 requests need 6 replicas of 4 slots: 2 of the 3 warm ones move, the Deployment's total stays
    assert (d.serving, d.warm, d.promote) == (6, 1, 2)
    assert d.total == 7
    assert new.panic_since == 100.0 and new.last_serving == 6
    # more queued than warm replicas can carry: still only the Ready warm ones, never a cold start
    d, _ = decide_panic(FAST, state, gauges.__class__(**{**gauges.to_dict(), "queue": 400.0,
                                                          "cold_start_samples_s": ()}))
    assert d is not None and (d.serving, d.warm, d.total) == (7, 0, 7)
    # the next full decision stays in panic. Where a warm replica pays, it serves what the requests
    # present need (20 running: 5) and the pool keeps the rest (the total asked for before stays)...
    kept = replace(new, total_recommendations=((95.0, 7),), last_data_s=95.0)
    full, _ = decide(FAST, kept, obs(105.0, 20.0, 6, running=20.0, queue=0.0, warm_ready=1))
    assert full.panic and full.serving == 5 and full.total == 7
    # ...at a warm cost of 1 (Knative's rule) it keeps what the fast path promoted
    at_one = FAST.with_(warm_cost_fraction=1.0, warm_pool_min=3, warm_pool_max=3)
    full, _ = decide(at_one, new, obs(105.0, 20.0, 6, running=20.0, queue=0.0, warm_ready=1))
    assert full.panic and full.serving >= 6


@pytest.mark.parametrize(
    "changes",
    [
        {"queue": 0.0},  # nobody waiting
        {"queue": None},
        {"queue": math.nan},
        {"queue": -5.0},
        {"stale": True},
        {"time_s": math.nan},
        {"warm_ready": 0},  # nothing Ready to promote
        {"running": 4.0, "queue": 1.0, "serving_ready": 4},  # the Ready serving slots can take them
    ],
)
def test_fast_panic_path_does_nothing_without_a_usable_queue(changes: dict) -> None:
    state = PolicyState(last_serving=4, last_warm=3)
    gauges = Observation(**{"time_s": 100.0, "value": None, "current_serving": 4, "serving_ready": 4,
                            "warm_ready": 3, "running": 16.0, "queue": 6.0, **changes})
    d, new = decide_panic(FAST, state, gauges)
    assert d is None and new == state
    # without concurrency slots configured the queue means nothing
    assert decide_panic(BASE, state, gauges.__class__(**{**gauges.to_dict(), "queue": 6.0, "stale": False,
                                                         "cold_start_samples_s": (), "time_s": 100.0}))[0] is None


def test_fast_path_promotes_nothing_when_more_already_serve_than_last_asked() -> None:
    # Found by the property test (a random seed in CI): the observation shows 2 serving where the last
    # decision asked for 1, with 1 waiting and 1 warm Ready. The fast path used to return a "panic"
    # decision that promoted nobody (serving 2 = what serves, promote 0) and consumed the pool.
    state = PolicyState(last_serving=1, last_warm=1)
    gauges = Observation(time_s=0.0, value=0.0, current_serving=2, serving_ready=0, warm_ready=1, queue=1.0)
    d, new = decide_panic(FAST, state, gauges)
    assert d is None and new == state
    # with room in the Deployment's total the same queue promotes the Ready warm replica
    d, _ = decide_panic(FAST, PolicyState(last_serving=2, last_warm=1), gauges)
    assert d is not None and (d.serving, d.warm, d.promote) == (3, 0, 1)


def test_a_stale_sample_keeps_the_burst_envelope() -> None:
    # Defect (issue 15): the hold rebuilt PolicyState without burst_needs, so one stale sample emptied
    # the envelope and the next fresh step deleted the warm pool the last burst asked for.
    d, state = decide(BURSTY, PolicyState(), obs(0.0, 20.0, 2, value_panic=80.0))
    d, state = decide(BURSTY, state, obs(60.0, 5.0, d.serving, value_panic=5.0))  # panic over, envelope holds
    assert not d.panic and d.serving + d.warm >= 8 and "burst envelope" in d.detail
    held, state = decide(BURSTY, state, obs(75.0, None, d.serving, stale=True))
    assert held.reason == Reason.HOLD and state.burst_needs
    d, state = decide(BURSTY, state, obs(90.0, 5.0, held.serving, value_panic=5.0))
    assert d.serving + d.warm >= 8 and "burst envelope" in d.detail, d.detail


def test_the_point_forecast_serves_and_the_margin_waits_warm_only_where_warm_is_cheaper() -> None:
    cheap = BASE.with_(warm_pool_max=5)
    d, _ = decide(cheap, PolicyState(), obs(0, 40.0, 4), forecast_value=100.0, forecast_upper=140.0)
    assert (d.serving, d.warm) == (10, 4)  # point forecast serves, the upper margin waits warm
    full = cheap.with_(warm_cost_fraction=1.0)
    d, _ = decide(full, PolicyState(), obs(0, 40.0, 4), forecast_value=100.0, forecast_upper=140.0)
    # same price: U is the serving headroom, the margin is not paid for a second time
    assert (d.serving, d.warm) == (10, 0)


def test_the_margin_asked_for_waits_warm_for_the_window_only_where_warm_is_cheaper() -> None:
    # 10 replicas were asked for in total a moment ago (serving and the forecast's margin); the need is
    # now 4 (serving's window agrees): the margin asked for waits warm for the window
    cfg = BASE.with_(warm_pool_max=3, scale_down_stabilization_s=300.0, max_scale_down_rate=10.0)
    state = PolicyState(last_serving=10, last_warm=0, serving_recommendations=((0.0, 4),),
                        total_recommendations=((0.0, 10),), last_data_s=0.0)
    d, _ = decide(cfg, state, obs(15, 40.0, 10))
    assert (d.serving, d.warm) == (4, 3)  # cheaper warm: the margin is held warm for the window
    d, _ = decide(cfg.with_(warm_cost_fraction=1.0), state, obs(15, 40.0, 10))
    assert (d.serving, d.warm) == (4, 0)  # same price: a warm replica would cost what it cost serving


def test_a_warm_replica_is_worth_the_cold_starts_share_of_the_lead_time() -> None:
    # reaction = a decision (15 s) + the whole stable window (60 s) + a scrape (15 s) = 90 s
    cfg = BASE.with_(default_cold_start_s=30.0)
    assert lead_time_s(cfg, ()) == 90.0 and cfg.warm_value(90.0) == 0.0
    assert cfg.warm_value(360.0) == pytest.approx(0.75)
    assert cfg.warm_value(0.0) == 0.0 and cfg.warm_value(math.nan) == 0.0
    assert cfg.with_(warm_cost_fraction=0.7).warm_pays(360.0)
    assert not cfg.with_(warm_cost_fraction=0.8).warm_pays(360.0)
    assert not cfg.with_(warm_cost_fraction=1.0).warm_pays(3600.0)


@pytest.mark.parametrize("cold_s, pays", [(30.0, False), (300.0, True)])
def test_a_cheaper_warm_replica_that_does_not_pay_leaves_the_policy_as_at_full_price(cold_s: float, pays: bool) -> None:
    """At 0.414 of a serving replica's price a warm one pays with a 300 s cold start (worth 0.75) but not
    with a 30 s one (worth 0): there the forecast's margin and freed replicas are not kept warm, and the
    decisions are exactly those at a warm cost of 1 (a cheaper warm replica never makes the policy worse).
    Without the short trend: where a warm replica pays its hedge is warm margin rather than serving
    (tests/brain/test_autoscaler.py::test_a_ready_forecaster_is_hedged_by_the_short_trend_...)."""
    cfg = BASE.with_(warm_pool_max=5, warm_cost_fraction=0.414, default_cold_start_s=cold_s,
                     scale_down_stabilization_s=300.0, max_scale_down_rate=10.0, trend_window_s=0.0)
    values = [40.0, 40.0, 100.0, 100.0, 60.0, 40.0, 40.0, 40.0]
    uppers = [60.0, 60.0, 140.0, 140.0, 90.0, 60.0, 60.0, 60.0]

    def run(c: PolicyConfig) -> list[tuple[int, int]]:
        state, out, current = PolicyState(), [], 4
        for i, (v, u) in enumerate(zip(values, uppers, strict=True)):
            d, state = decide(c, state, obs(15.0 * i, v, current), forecast_value=v, forecast_upper=u)
            out.append((d.serving, d.warm))
            current = d.serving
        return out

    cheap, full = run(cfg), run(cfg.with_(warm_cost_fraction=1.0))
    assert [s for s, _ in cheap] == [s for s, _ in full]
    assert all(w == 0 for _, w in full)
    if pays:
        assert any(w > 0 for _, w in cheap)
    else:
        assert cheap == full


def test_queue_promotions_are_on_loan_from_the_warm_pool_and_start_nothing_cold() -> None:
    """Where warm pays, the queue promotes the forecast's margin from the warm pool (at most warm_pool_max);
    while they serve the queue those replicas are still the pool's, so it is not refilled with cold
    starts: the Deployment's total does not grow because requests queued."""
    cfg = SLOTS.with_(scale_down_stabilization_s=600.0, max_scale_down_rate=10.0, warm_pool_max=2)
    # the rates and the forecast need 2 replicas, the upper forecast 8: 2 serving + 2 warm (the cap)
    d, state = decide(cfg, PolicyState(), obs(0.0, 20.0, 2), forecast_value=20.0, forecast_upper=80.0)
    assert (d.serving, d.warm) == (2, 2)
    # requests queue: both warm replicas are promoted, and no replica is started for the pool
    d, state = decide(cfg, state, obs(15.0, 20.0, 2, running=8.0, queue=6.0, warm_ready=2),
                      forecast_value=20.0, forecast_upper=80.0)
    assert d.panic and (d.serving, d.promote) == (4, 2)
    assert (d.warm, d.total) == (0, 4)
    # the queue is gone and the panic is over: they are back in the pool
    for t in range(30, 121, 15):
        d, state = decide(cfg, state, obs(float(t), 20.0, d.serving, running=8.0, queue=0.0),
                          forecast_value=20.0, forecast_upper=80.0)
    assert (d.serving, d.warm) == (2, 2), d.detail


def test_queue_panic_where_warm_pays_serves_what_is_present_and_holds_no_sub_panic_peak() -> None:
    """Where a warm replica pays, a queue's panic asks for what the requests present need now (the
    promoted replicas go back to the pool, which returns them in seconds), and the short window's rate
    is held for the scale-down window only when it is a panic by itself (>= panic_threshold x serving)."""
    cfg = SLOTS.with_(scale_down_stabilization_s=600.0, max_scale_down_rate=10.0, warm_pool_max=4)
    # the 60 s rate needs 2, the 6 s rate 3 (not a panic by itself: 1.5x), 16 requests present need 4
    d, state = decide(cfg, PolicyState(), obs(0.0, 20.0, 2, value_panic=30.0, running=8.0, queue=8.0, warm_ready=2))
    assert d.panic and (d.serving, d.promote) == (4, 2)
    total = d.total
    # the queue is gone, the panic not yet over: serve what is present (the 6 s rate's 3), not the 4
    d, state = decide(cfg, state, obs(15.0, 20.0, 4, value_panic=30.0, running=8.0, queue=0.0))
    assert d.panic and d.serving == 3 and d.total == total, d.detail
    # after the panic the 6 s peak is not held for the window: the rates' 2 serve, the rest waits warm
    for t in range(30, 121, 15):
        d, state = decide(cfg, state, obs(float(t), 20.0, d.serving, value_panic=20.0, running=8.0, queue=0.0))
    assert not d.panic and d.serving == 2 and d.total == total, d.detail
    # at a warm cost of 1 Knative's rule stands: in panic never below what serves
    full = cfg.with_(warm_cost_fraction=1.0, warm_pool_min=2, warm_pool_max=2)
    d, state = decide(full, PolicyState(), obs(0.0, 20.0, 2, value_panic=30.0, running=8.0, queue=8.0, warm_ready=2))
    d, _ = decide(full, state, obs(15.0, 20.0, d.serving, value_panic=30.0, running=8.0, queue=0.0))
    assert d.panic and d.serving == 4
