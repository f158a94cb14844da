"""Unit and property tests of the online forecasters on generated traffic (no shared traces)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from preheat.scaling.forecast import (
    DAY_S,
    KINDS,
    EnsembleForecaster,
    HoltWinters,
    Persistence,
    QuantileForecaster,
    TrendForecaster,
    forecaster_from_dict,
    make_forecaster,
)

HOUR = 3600.0


def daily_traffic(t: np.ndarray, base: float = 100.0, amp: float = 60.0) -> np.ndarray:
    """A day-shaped request rate: quiet night, morning ramp, afternoon peak."""
    phase = 2 * np.pi * (t % DAY_S) / DAY_S
    return base + amp * np.sin(phase - np.pi / 2) + 0.3 * amp * np.sin(2 * phase)


def series(days: float, step_s: float, noise: float = 0.05, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, days * DAY_S, step_s)
    y = daily_traffic(t) * (1.0 + noise * rng.standard_normal(t.size))
    return t, np.maximum(y, 0.0)


def feed(f, t: np.ndarray, y: np.ndarray) -> None:
    for ti, yi in zip(t.tolist(), y.tolist(), strict=True):
        f.update(ti, yi)


def mean_abs_error(f, t: np.ndarray, y: np.ndarray, horizon_s: float, step_s: float) -> float:
    """Walk (t, y) online and return the mean |forecast - truth| at `horizon_s`, truth noise-free."""
    errs = []
    for ti, yi in zip(t.tolist(), y.tolist(), strict=True):
        f.update(ti, yi)
        p = f.forecast(ti, horizon_s)
        errs.append(abs(p - float(daily_traffic(np.array([ti + horizon_s]))[0])))
    return float(np.mean(errs))


@pytest.mark.parametrize("step_s", [60.0, 600.0])
def test_holt_winters_learns_the_daily_pattern(step_s: float) -> None:
    """After two days it forecasts an hour ahead far better than persistence (same data, side by side)."""
    t, y = series(3, step_s)
    split = int(2 * DAY_S / step_s)
    hw, pers = make_forecaster("holt-winters", step_s=step_s), Persistence()
    feed(hw, t[:split], y[:split])
    feed(pers, t[:split], y[:split])
    assert hw.ready
    err_hw = mean_abs_error(hw, t[split:], y[split:], HOUR, step_s)
    err_p = mean_abs_error(pers, t[split:], y[split:], HOUR, step_s)
    assert err_hw < 0.5 * err_p
    assert err_hw < 0.12 * 60.0  # well inside the pattern's amplitude


def test_sample_spacing_does_not_change_what_is_learned() -> None:
    """15 s samples and 10-minute windows of the same traffic give nearly the same daily profile."""
    profiles = []
    for step in (15.0, 600.0):
        hw = HoltWinters(knots=24)
        t, y = series(2, step, noise=0.0)
        feed(hw, t, y)
        profiles.append(np.array(hw.daily.values))
    assert np.max(np.abs(profiles[0] - profiles[1])) < 0.1 * 60.0


def test_falls_back_to_trend_while_history_is_short() -> None:
    hw = HoltWinters()
    for i in range(60):  # one hour of a clean ramp at 60 s
        hw.update(i * 60.0, 10.0 + 0.01 * i * 60.0)
    assert not hw.ready
    p = hw.forecast(59 * 60.0, 300.0)
    now = 10.0 + 0.01 * 59 * 60.0
    assert p is not None and p > now  # the trend fallback sees the ramp
    assert p <= now + 0.01 * 300.0 + 1e-6  # damped, never beyond the straight line


def test_trend_beats_persistence_on_a_ramp() -> None:
    trend, pers = TrendForecaster(), Persistence()
    t = np.arange(0.0, 7200.0, 15.0)
    y = 20.0 + 0.02 * t
    e_trend = mean_abs_error_linear(trend, t, y, 120.0)
    e_pers = mean_abs_error_linear(pers, t, y, 120.0)
    assert e_trend < 0.8 * e_pers


def mean_abs_error_linear(f, t: np.ndarray, y: np.ndarray, h: float) -> float:
    errs = []
    for ti, yi in zip(t.tolist(), y.tolist(), strict=True):
        f.update(ti, yi)
        errs.append(abs(f.forecast(ti, h) - (20.0 + 0.02 * (ti + h))))
    return float(np.mean(errs[20:]))


@pytest.mark.parametrize("kind", KINDS)
def test_serialisation_round_trip_continues_identically(kind: str) -> None:
    t, y = series(1.3, 600.0)
    f = make_forecaster(kind, step_s=600.0)
    feed(f, t[:150], y[:150])
    g = forecaster_from_dict(json.loads(json.dumps(f.to_dict())))
    assert type(g) is type(f) and g.ready == f.ready
    for h in (60.0, 600.0, HOUR):
        assert g.forecast(t[149], h) == f.forecast(t[149], h)
        assert g.forecast_upper(t[149], h, 0.9) == f.forecast_upper(t[149], h, 0.9)
    feed(f, t[150:], y[150:])
    feed(g, t[150:], y[150:])
    assert g.forecast(t[-1], HOUR) == pytest.approx(f.forecast(t[-1], HOUR), rel=1e-12)
    assert g.to_dict() == f.to_dict()


@pytest.mark.parametrize("kind", KINDS)
def test_bad_samples_are_gaps_not_data(kind: str) -> None:
    """None, NaN, inf and negative samples (counter resets) are ignored: same forecasts as without them."""
    t, y = series(1.2, 600.0)
    clean, dirty = make_forecaster(kind, step_s=600.0), make_forecaster(kind, step_s=600.0)
    bad = [None, math.nan, math.inf, -5.0]
    for i, (ti, yi) in enumerate(zip(t.tolist(), y.tolist(), strict=True)):
        clean.update(ti, yi)
        if i % 7 == 3:
            dirty.update(ti - 1.0, bad[i % len(bad)])
        dirty.update(ti, yi)
    for h in (600.0, HOUR):
        assert dirty.forecast(t[-1], h) == pytest.approx(clean.forecast(t[-1], h))


def test_gap_of_hours_then_recovery() -> None:
    t, y = series(3, 60.0)
    hw = make_forecaster("auto", step_s=60.0)
    keep = (t < 1.5 * DAY_S) | (t > 1.5 * DAY_S + 8 * HOUR)  # an 8-hour outage of the metrics
    feed(hw, t[keep][: np.searchsorted(t[keep], 2 * DAY_S)], y[keep][: np.searchsorted(t[keep], 2 * DAY_S)])
    p = hw.forecast(2 * DAY_S, HOUR)
    truth = float(daily_traffic(np.array([2 * DAY_S + HOUR]))[0])
    assert p is not None and abs(p - truth) < 0.25 * truth
    # forecasting across the gap itself (no samples for hours) still answers from the profile
    assert hw.forecast(1.5 * DAY_S + 4 * HOUR, HOUR) is not None


def test_zero_traffic_forecasts_zero_not_negative() -> None:
    for kind in KINDS:
        f = make_forecaster(kind, step_s=600.0)
        for i in range(300):
            f.update(i * 600.0, 0.0)
        assert f.forecast(300 * 600.0, HOUR) == pytest.approx(0.0, abs=1e-9)
        assert f.forecast_upper(300 * 600.0, HOUR, 0.9) >= 0.0


def test_a_one_off_spike_does_not_scar_the_daily_profile() -> None:
    t, y = series(3, 600.0, noise=0.02)
    spike_at = int((DAY_S + 10 * HOUR) / 600.0)
    y = y.copy()
    y[spike_at] *= 50  # e.g. a bad counter delta
    hw = HoltWinters()
    feed(hw, t[: spike_at + 1 + 144], y[: spike_at + 1 + 144])
    p = hw.forecast(t[spike_at + 144] - 600.0, 600.0)  # the same time the next day
    truth = float(daily_traffic(np.array([t[spike_at + 144]]))[0])
    assert abs(p - truth) < 0.2 * truth


def test_upper_quantile_covers_about_q_and_grows_with_q() -> None:
    rng = np.random.default_rng(3)
    q = QuantileForecaster(Persistence(), horizons_s=(600.0,))
    hits, n = 0, 0
    value = 100.0
    upper = math.inf
    for i in range(1500):
        actual = value * (1.0 + 0.1 * rng.standard_normal())
        if i > 300:
            n += 1
            hits += actual <= upper
        q.update(i * 600.0, actual)
        upper = q.forecast_upper(i * 600.0, 600.0, 0.9)
        assert upper >= q.forecast(i * 600.0, 600.0)
    assert 0.84 <= hits / n <= 0.96
    t = 1500 * 600.0
    assert q.forecast_upper(t, 600.0, 0.99) > q.forecast_upper(t, 600.0, 0.9) > q.forecast_upper(t, 600.0, 0.6)


def test_ensemble_learns_to_trust_the_better_model() -> None:
    t, y = series(3, 600.0, noise=0.02)
    ens = EnsembleForecaster({"holt-winters": HoltWinters(), "persistence": Persistence()})
    feed(ens, t, y)
    w_hw, w_p = ens.weights(HOUR)
    assert w_hw > 0.7 and w_p < 0.3


def test_unknown_kinds_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="unknown forecaster kind 'prophet'"):
        make_forecaster("prophet")
    with pytest.raises(ValueError, match="cannot restore forecaster of kind 'nope'"):
        forecaster_from_dict({"kind": "nope"})


samples = st.lists(
    st.tuples(
        st.one_of(st.floats(-1e3, 1e7), st.just(math.nan)),
        st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1e4)),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), data=samples, h=st.floats(0.0, 1e5), q=st.floats(0.01, 0.99))
def test_any_input_gives_a_defined_forecast(kind: str, data, h: float, q: float) -> None:
    f = make_forecaster(kind, step_s=60.0)
    for t, v in data:
        f.update(t, v)
    for t_now in (0.0, 1e6):
        p = f.forecast(t_now, h)
        u = f.forecast_upper(t_now, h, q)
        assert p is None or (math.isfinite(p) and p >= 0)
        assert (u is None) == (p is None)
        if u is not None:
            assert math.isfinite(u) and u >= p
    assert f.forecast(math.nan, h) is None
    json.dumps(f.to_dict())
