"""The Autoscaler end to end on a generated business-hours trace with a tiny fleet model.

The fleet here is deliberately minimal (pods become Ready a fixed cold start after they are asked
for; removal is immediate): enough to check that forecast-driven capacity arrives before the daily
ramp by at least the cold start, that reactive-only scaling does not, and that the state survives
an operator restart. The real simulator lives in preheat.sim.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from preheat.scaling.autoscaler import Autoscaler, ScalingPolicy
from preheat.scaling.forecast import DAY_S
from preheat.scaling.policy import Decision, Observation, PolicyConfig, PolicyState, replicas_needed

COLD_START_S = 300.0
STEP_S = 120.0  # decision interval; coarser than the operator's 15 s to keep the test fast
CONFIG = PolicyConfig(min_replicas=1, max_replicas=40, target_per_replica=10.0, target_utilization=0.8,
                      decision_interval_s=STEP_S, warm_pool_min=1, warm_pool_max=4,
                      scale_down_stabilization_s=300.0)


def business_hours(t: float, rng: np.random.Generator) -> float:
    """20 req/s at night, ~150 from a sharp 08:00 ramp to an 18:00 drop, 5 % noise."""
    hour = (t % DAY_S) / 3600.0
    up = 1.0 / (1.0 + math.exp(-(hour - 8.0) / 0.25))
    down = 1.0 / (1.0 + math.exp((hour - 18.0) / 0.5))
    return max(0.0, (20.0 + 130.0 * up * down) * (1.0 + 0.05 * rng.standard_normal()))


def replay(scaler: ScalingPolicy, days: float, seed: int = 11) -> list[tuple[float, float, Decision, int]]:
    """(time, signal, decision, Ready pods) per decision through a fleet with fixed cold starts."""
    rng = np.random.default_rng(seed)
    ready_at: list[float] = []
    serving = 1
    out = []
    for i in range(int(days * DAY_S / STEP_S)):
        t = i * STEP_S
        y = business_hours(t, rng)
        ready = sum(r <= t for r in ready_at)
        obs = Observation(time_s=t, value=y, current_serving=min(serving, len(ready_at)),
                          serving_ready=min(serving, ready), warm_ready=max(0, ready - serving),
                          starting=len(ready_at) - ready, cold_start_samples_s=(COLD_START_S,) * 5)
        d = scaler.decide(obs)
        serving = d.serving
        while len(ready_at) < d.total:
            ready_at.append(t + COLD_START_S)
        if len(ready_at) > d.total:
            ready_at.sort()  # remove the youngest (not yet Ready) first
            del ready_at[d.total:]
        out.append((t, y, d, sum(r <= t for r in ready_at)))
    return out


def ramp_times(run, day: int) -> dict[str, float]:
    """When, on `day`, the signal first needed 10 replicas, when the autoscaler first asked for 10
    beyond the fixed warm-pool minimum (serving + forecast-driven warm pool), and when 10 were Ready."""
    start = day * DAY_S + 4 * 3600  # after the night
    need = next(t for t, y, _, _ in run if t >= start and replicas_needed(y, CONFIG) >= 10)
    asked = next(t for t, _, d, _ in run if t >= start and d.total - CONFIG.warm_pool_min >= 10)
    ready = next(t for t, _, _, r in run if t >= start and r >= 10)
    return {"need": need, "asked": asked, "ready": ready}


def under_capacity_minutes(run, day: int) -> float:
    """Minutes of `day`'s morning ramp (06:00-10:00) with fewer Ready pods (serving + warm, promoted in
    seconds) than needed at the target utilization. Outside the ramp a shortfall is the 5 % noise
    lifting the need by one replica for a step, which the target utilization's headroom is for (the
    policy sizes serving by the point forecast at U): neither mode is ever short of the flat-out need."""
    ramp = [(t, y, ready) for t, y, _, ready in run
            if day * DAY_S + 6 * 3600 <= t < day * DAY_S + 10 * 3600]
    return sum(1 for _, y, ready in ramp if ready < replicas_needed(y, CONFIG)) * STEP_S / 60.0


@pytest.fixture(scope="module")
def runs() -> dict[str, list]:
    return {
        "preheat": replay(Autoscaler(CONFIG), days=2.5),
        "reactive": replay(Autoscaler(CONFIG.with_(forecasting=False)), days=2.5),
        "margin": replay(Autoscaler(CONFIG.with_(margin_in_serving=True)), days=2.5),
    }


def test_capacity_arrives_before_the_daily_ramp_by_the_cold_start(runs) -> None:
    preheat, reactive, margin = runs["preheat"], runs["reactive"], runs["margin"]
    for day in (1, 2):  # once a day of history exists
        # Default: serving follows the point forecast at the target utilization; capacity is Ready
        # before the ramp needs it, and the ramp is short of capacity far less often than reactive.
        p = ramp_times(preheat, day)
        assert p["ready"] <= p["need"], (day, p)
        assert under_capacity_minutes(preheat, day) <= 0.4 * under_capacity_minutes(reactive, day)
        # With the upper-quantile margin in serving too (margin_in_serving: costlier), the replicas are
        # ordered at least a cold start ahead and the ramp is never short.
        m = ramp_times(margin, day)
        assert m["asked"] <= m["need"] - COLD_START_S, (day, m)
        assert m["ready"] <= m["need"], (day, m)
        assert under_capacity_minutes(margin, day) <= 0.25 * under_capacity_minutes(reactive, day)
        r = ramp_times(reactive, day)
        assert r["ready"] > p["ready"] and r["asked"] >= r["need"], (day, r)
    # the forecast term won decisions during the ramp, and said so
    ramp = [d for t, _, d, _ in preheat if 2 * DAY_S + 7 * 3600 <= t < 2 * DAY_S + 8 * 3600]
    assert any(d.reason == "forecast" and "forecast" in d.detail for d in ramp)


def test_no_runaway_while_pods_are_starting(runs) -> None:
    """Starting pods are not counted twice: the Deployment never exceeds what the traffic needs (without
    the trend hedge), nor what the decisions' own terms asked for (with it: the signal's short trend
    projected over the 465 s lead time asks above the day's peak on this noisy ramp, 29 replicas where
    the peak needs 23, and gives them back as soon as the line flattens)."""
    run = runs["preheat"]
    peak_need = max(replicas_needed(y, CONFIG) for _, y, _, _ in run)
    asked = max(max(d.reactive_need, d.forecast_need, d.panic_need) for _, _, d, _ in run)
    assert max(d.total for _, _, d, _ in run) <= asked + CONFIG.warm_pool_max + 2
    assert all(d.total <= CONFIG.max_replicas for _, _, d, _ in run)
    no_hedge = replay(Autoscaler(CONFIG.with_(trend_window_s=0.0)), days=2.5)
    assert max(d.total for _, _, d, _ in no_hedge) <= peak_need + CONFIG.warm_pool_max + 2


def test_state_survives_a_restart() -> None:
    """Serialised mid-run (as the operator persists it) and restored, it decides exactly as before."""
    rng = np.random.default_rng(5)
    a = Autoscaler(CONFIG)
    for i in range(int(1.1 * DAY_S / STEP_S)):
        t = i * STEP_S
        a.step(Observation(time_s=t, value=business_hours(t, rng), current_serving=5))
    b = Autoscaler.from_dict(json.loads(json.dumps(a.to_dict())))
    assert b.config == a.config and b.state == a.state
    for i in range(int(1.1 * DAY_S / STEP_S), int(1.1 * DAY_S / STEP_S) + 120):
        t = i * STEP_S
        obs = Observation(time_s=t, value=business_hours(t, rng), current_serving=5,
                          cold_start_samples_s=(COLD_START_S,))
        assert a.step(obs) == b.step(obs)
    # a changed spec applies on restore while keeping what was learned
    c = Autoscaler.from_dict(a.to_dict(), config=CONFIG.with_(max_replicas=3))
    assert c.step(Observation(time_s=2 * DAY_S, value=150.0, current_serving=5)).serving == 3


def test_autoscaler_holds_on_missing_metrics_and_keeps_forecasting() -> None:
    a = Autoscaler(CONFIG)
    rng = np.random.default_rng(9)
    last = None
    for i in range(int(1.2 * DAY_S / STEP_S)):
        t = i * STEP_S
        last = a.step(Observation(time_s=t, value=business_hours(t, rng), current_serving=last.serving if last else 1))
    held = a.step(Observation(time_s=1.2 * DAY_S + 60, value=None, current_serving=last.serving))
    assert held.serving >= last.serving and held.reason in ("hold", "forecast")
    assert held.forecast_value is not None
    assert held.lead_time_s == CONFIG.default_cold_start_s + STEP_S + CONFIG.signal_lag_s  # nothing measured
    stale = a.step(Observation(time_s=1.2 * DAY_S + 120, value=1.0, stale=True, current_serving=last.serving))
    assert stale.serving >= last.serving


def test_step_decides_exactly_like_the_pure_decide() -> None:
    """The Autoscaler's shortcut (cold starts cleaned and sorted once per step) changes no decision:
    replay a day, then decide every observation again with the pure `decide` and the same forecasts."""
    from preheat.scaling.policy import PolicyState, decide

    scaler = Autoscaler(CONFIG)
    seen: list[tuple[Observation, Decision]] = []
    step = scaler.step

    def recording(o: Observation) -> Decision:
        d = step(o)
        # the raw forecasts and readiness the step decided with (the decision's forecast_value has the
        # short trend's floor in it)
        raw = scaler.forecast_over(float(o.time_s), d.lead_time_s)
        ready = scaler.forecaster.ready
        seen.append((o, d, raw, ready, ready and scaler.forecaster.seasonal))
        return d

    scaler.decide = recording  # type: ignore[method-assign]
    replay(scaler, days=1.0)
    # vary the cold-start samples too: broken ones, none (the remembered ones are used)
    for i, samples in enumerate([(math.nan, 40.0, -1.0), (), (None, "x", 80.0, 20.0)]):
        recording(Observation(time_s=DAY_S + i * STEP_S, value=30.0, current_serving=3,
                              cold_start_samples_s=samples))  # type: ignore[arg-type]
    state = PolicyState()
    for o, d, (fv, fu), ready, seasonal in seen:
        again, state = decide(CONFIG, state, o, fv, fu, ready, seasonal)
        assert again == d
    assert any(seasonal for *_, seasonal in seen) and not all(seasonal for *_, seasonal in seen)


class _FixedForecaster:
    """A forecaster that always says 100 (upper 140), ready or not."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready

    def update(self, t_s: float, value: float | None) -> None:
        pass

    def forecast(self, t_s: float, horizon_s: float) -> float:
        return 100.0

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float:
        return 140.0

    def to_dict(self) -> dict:
        return {"kind": "fixed"}


@pytest.mark.parametrize("ready", [True, False])
def test_the_upper_quantile_sizes_a_warm_margin_only_from_a_ready_forecaster(ready: bool) -> None:
    """Where a warm replica pays (0.414 with a 300 s cold start), the gap between the upper and the point
    forecast waits warm once the forecaster has its full model; before that (a level model's spread over
    the lead time, which the serving headroom already prices) the pool holds no margin."""
    config = PolicyConfig(min_replicas=1, max_replicas=50, target_per_replica=10.0, target_utilization=1.0,
                          warm_pool_max=5, warm_cost_fraction=0.414, default_cold_start_s=300.0)
    assert config.warm_pays(360.0)  # lead: 300 s + a 15 s interval + 30 s of rate window + a 15 s scrape
    d = Autoscaler(config, _FixedForecaster(ready)).step(
        Observation(time_s=0.0, value=40.0, current_serving=4, serving_ready=4))
    assert d.serving == 10 and d.forecast_upper == 140.0
    assert d.warm == (4 if ready else 0)


class _LevelForecaster:
    """Forecasts the last value seen (a level model: what a forecaster without its season says)."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready
        self.last: float | None = None

    def update(self, t_s: float, value: float | None) -> None:
        self.last = value

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        return self.last

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        return self.last

    def to_dict(self) -> dict:
        return {"kind": "level"}


def _ramp(scaler: Autoscaler, until_s: float = 300.0) -> Decision:
    """The signal rises 1/s from 100 (a 15 s decision interval); the decision at `until_s`."""
    d = None
    for i in range(int(until_s // 15) + 1):
        t = 15.0 * i
        d = scaler.step(Observation(time_s=t, value=100.0 + t, current_serving=10, serving_ready=10))
    assert d is not None
    return d


def test_a_forecaster_without_its_season_is_floored_by_the_signals_short_trend_on_a_ramp() -> None:
    """A level forecast follows a ramp a signal lag late. Until the forecaster is ready, a least-squares
    line through the last trend_window_s of the signal, projected by the signal's lag (half the 60 s
    window + a 15 s scrape) and one interval, floors the point forecast: at t = 300 s the signal is 400 and
    rises 1/s, so the floor is 460 (46 replicas of 10) where the level asks for 40. With the floor turned
    off the level decides; the trend's samples survive a restart through JSON."""
    config = PolicyConfig(min_replicas=1, max_replicas=100, target_per_replica=10.0, target_utilization=1.0)
    assert config.signal_lag_s + config.decision_interval_s == 60.0
    floored = _ramp(Autoscaler(config, _LevelForecaster(ready=False)))
    assert floored.forecast_value == pytest.approx(460.0) and floored.serving == 46
    off = config.with_(trend_window_s=0.0)
    assert _ramp(Autoscaler(off, _LevelForecaster(ready=True))).serving == 40
    assert _ramp(Autoscaler(off, _LevelForecaster(ready=False))).serving == 40

    # The samples the line needs are policy state: a restart from JSON half-way decides the same.
    half = Autoscaler(config, _LevelForecaster(ready=False))
    _ramp(half, until_s=150.0)
    assert len(half.state.recent_signal) == 11
    saved = json.loads(json.dumps(half.state.to_dict()))
    restored = Autoscaler(config, _LevelForecaster(ready=False), PolicyState.from_dict(saved))
    for i in range(11, 21):
        t = 15.0 * i
        obs = Observation(time_s=t, value=100.0 + t, current_serving=10, serving_ready=10)
        assert restored.step(obs) == (d := half.step(obs))
    assert d.serving == 46
    # A falling signal never lowers the forecast below the level's.
    down = Autoscaler(config, _LevelForecaster(ready=False))
    for i in range(21):
        d = down.step(Observation(time_s=15.0 * i, value=400.0 - 15.0 * i, current_serving=40, serving_ready=40))
    assert d.forecast_value == pytest.approx(100.0)


def test_a_ready_forecaster_is_hedged_by_the_short_trend_over_the_lead_time_and_the_hedge_is_not_held() -> None:
    """With its season the forecaster does not see a surge that is not in it. The same least-squares line,
    projected over the lead time (when a replica ordered now serves: 60 s default cold start + 15 s
    interval + 45 s signal lag = 120 s), floors the point forecast: at t = 300 s the signal is 400 and
    rises 1/s, so 520 (52 replicas) where the level asks for 40. When the ramp stops, what only the
    trend asked for is not held by the scale-down window (300 s): once the line is flat the fleet is back
    at 40, where the floor without a season (the forecast's stand-in) is held like a forecast. Where a
    warm replica pays, the hedge is warm margin instead: serving follows the level."""
    config = PolicyConfig(min_replicas=1, max_replicas=100, target_per_replica=10.0, target_utilization=1.0)
    assert config.signal_lag_s + config.decision_interval_s + config.default_cold_start_s == 120.0

    def ramp_then_flat(scaler: Autoscaler) -> tuple[Decision, Decision]:
        peak = _ramp(scaler)
        d = peak
        for i in range(21, 42):  # flat at 400 from 315 s to 615 s
            d = scaler.step(Observation(time_s=15.0 * i, value=400.0, current_serving=d.serving,
                                        serving_ready=d.serving))
        return peak, d

    peak, after = ramp_then_flat(Autoscaler(config, _LevelForecaster(ready=True)))
    assert peak.forecast_value == pytest.approx(520.0) and peak.serving == 52
    assert after.serving == 40  # the line is flat: nothing of the hedge is held
    _, unready = ramp_then_flat(Autoscaler(config, _LevelForecaster(ready=False)))
    assert unready.serving > 40  # without a season the floor is the forecast, held for the window

    warm = config.with_(warm_pool_max=50, warm_cost_fraction=0.414, default_cold_start_s=300.0)
    assert warm.warm_pays(360.0)
    d = _ramp(Autoscaler(warm, _LevelForecaster(ready=True)))
    # serving follows the level (40); the line projected 360 s ahead, 760, is the pool's margin (76 - 40)
    assert d.serving == 40 and d.forecast_upper == pytest.approx(760.0) and d.warm == 36
    # A forecaster with no upper quantile: the line against the point forecast is the margin, the same pool.
    assert _ramp(Autoscaler(warm, _NoUpperForecaster(ready=True))) == d
    falling = Autoscaler(warm, _NoUpperForecaster(ready=True))
    for i in range(21):
        d = falling.step(Observation(time_s=15.0 * i, value=400.0 - 15.0 * i, current_serving=40, serving_ready=40))
    assert d.forecast_upper == pytest.approx(100.0)  # a falling line never lowers it below the point forecast


class _NoUpperForecaster(_LevelForecaster):
    """A level forecaster that has no upper quantile."""

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        return None


class _SeasonalLevel(_LevelForecaster):
    """A level forecaster whose ready model knows a season (as Holt-Winters once it has a day)."""

    seasonal = True


@pytest.mark.parametrize(("forecaster", "windows"), [(_SeasonalLevel(ready=True), 1.0),
                                                       (_SeasonalLevel(ready=False), 2.0),
                                                       (_LevelForecaster(ready=True), 2.0)])
def test_a_forecaster_with_its_season_holds_a_replica_one_lead_time(forecaster, windows) -> None:
    """The scale-down window is one lead time only where the forecaster is ready and knows a season; a
    ready model without one (a level, a trend) and a seasonal one still learning hold 1 + 1/U."""
    config = PolicyConfig(min_replicas=1, max_replicas=50, target_per_replica=10.0, target_utilization=1.0)
    scaler = Autoscaler(config, forecaster)
    lead = scaler.step(Observation(time_s=0.0, value=200.0, current_serving=20, serving_ready=20)).lead_time_s
    held = [scaler.step(Observation(time_s=t, value=200.0 - 2.0 * t / 15.0, current_serving=20, serving_ready=20))
            for t in (15.0 * i for i in range(1, 41))]
    # the signal falls 2 per decision from 200: serving is the need of the oldest decision in the window
    last = held[-1]
    assert last.detail.count(f"highest recommendation in the last {windows * lead:g}s") == 1
