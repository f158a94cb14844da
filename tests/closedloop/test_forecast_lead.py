"""The closed loop's forecast, offline: the operator's own autoscaler, built from the experiment's endpoint spec,
fed the history the experiment writes into Prometheus and then the replay's load as Prometheus reports it.

This is the design check behind the cluster test (tests/closedloop/test_closed_loop.py): on the
time-compressed ServeGen morning ramp, with "yesterday" in its history, the seasonal forecaster on the
load's clock orders the ramp's replicas a cold start ahead (reason `forecast`), and the reactive-only
configuration of the same operator orders them only after the demand arrived. No cluster: the
Prometheus side is modelled (rate over the spec's window from the written counter and from the
replay's arrivals), everything else is the operator's code.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from preheat.controller.spec import duration_s, parse_spec
from preheat.scaling.autoscaler import Autoscaler
from preheat.scaling.forecast import make_forecaster
from preheat.scaling.from_spec import (
    TimeScaledForecaster,
    autoscaler_from_spec,
    forecast_ready,
    forecaster_from_spec,
    policy_config,
    seed,
)
from preheat.scaling.policy import Observation, Reason
from preheat_lab.closedloop import endpoint_manifest
from preheat_lab.closedloop import metrics as M
from preheat_lab.closedloop.experiment import LoopConfig
from preheat_lab.closedloop.history import TraceClock, counter_samples
from preheat_lab.closedloop.workload import COMPRESS, SLICE_START_IN_DAY_S, load_workload
from preheat_lab.loadgen import offered_rate

DATA = Path(__file__).parent / "data"
COLD_S = 30.0  # a quiet machine's tiny-model cold start (docs/closedloop.md)


def _windowed(t: np.ndarray, cum: np.ndarray, at: float, window: float) -> float:
    """Prometheus' rate(counter[window]) at `at` (5 s scrapes), from a cumulative-count series."""
    end = math.floor(at / 5.0) * 5.0
    lo, hi = np.interp([end - window, end], t, cum)
    return float(hi - lo) / window


def run_offline(reactive_only: bool) -> tuple[list[tuple[float, int, str]], np.ndarray, np.ndarray, Autoscaler]:
    wl = load_workload(DATA / "servegen_m-small_days1-2.csv", start_s=86400 + SLICE_START_IN_DAY_S)
    cfg = LoopConfig(kubeconfig=Path("/dev/null"), prometheus_url="http://x", out_dir=Path("/tmp"))
    spec = parse_spec(endpoint_manifest(cfg, "preheat")["spec"])
    config = policy_config(spec, reactive_only=reactive_only)
    autoscaler = autoscaler_from_spec(spec, config)
    window = duration_s(spec.prometheus.window)
    panic = duration_s(spec.prometheus.panic_window)

    t0 = 1_800_000_000.0
    clock = TraceClock(t0, wl.slice_start_s, COMPRESS)
    # The history block, then the replay's arrivals, as one cumulative counter (what Prometheus holds).
    hist = counter_samples(wl.rate, clock, wl.history_start_s, t0)
    arr = np.array([t0 + a.t_s for a in wl.arrivals])
    t = np.concatenate([[s[0] for s in hist], arr])
    cum = np.concatenate([[s[1] for s in hist], hist[-1][1] + np.arange(1, arr.size + 1)])
    # The operator's start-up replay: query_range over two seasons of the load's clock, at the interval.
    step = config.decision_interval_s
    span = 2 * 86400 / spec.scaling.forecasting.time_compression
    samples = [(w, _windowed(t, cum, w, window)) for w in np.arange(t0 - span, t0, step) if w - window >= t[0]]
    seed(autoscaler, samples)
    assert forecast_ready(autoscaler), "two days of history should make the seasonal model ready"

    orders, serving = [], 2
    for w in np.arange(t0, t0 + wl.arrivals[-1].t_s, step):
        obs = Observation(time_s=float(w), value=_windowed(t, cum, w, window),
                          value_panic=_windowed(t, cum, w, panic), serving_ready=serving,
                          warm_ready=config.warm_pool_min, current_serving=serving, cold_start_samples_s=(COLD_S,))
        d = autoscaler.step(obs)
        if d.serving > serving:
            orders.append((float(w - t0), d.serving, str(d.reason)))
        serving = d.serving
    off_t, off_r = offered_rate(wl.arrivals, 1.0)
    need_t, need = M.need_series(off_t, off_r, cfg.target_per_replica)
    return orders, need_t, need, autoscaler


def _ramp_level(need_t: np.ndarray, need: np.ndarray) -> tuple[int, float]:
    """The first replica level above the trough's (the level the morning ramp brings), and when the
    offered load first needs it. Higher levels exist only in the Poisson noise of the peak."""
    trough = int(need[need_t < 20.0].max())
    level = trough + 1
    assert need.max() >= level, "the ramp should need more replicas than the trough"
    return level, float(need_t[np.flatnonzero(need >= level)[0]])


def _first_order(orders, k):
    return next(((t, r) for t, s, r in orders if s >= k), (None, None))


def test_the_seasonal_forecaster_on_the_load_clock_orders_the_ramp_a_cold_start_ahead():
    orders, need_t, need, autoscaler = run_offline(reactive_only=False)
    assert isinstance(autoscaler.forecaster, TimeScaledForecaster) and autoscaler.forecaster.scale == COMPRESS
    level, t_need = _ramp_level(need_t, need)
    t_order, reason = _first_order(orders, level)
    assert t_order is not None, orders
    assert reason == Reason.FORECAST, orders
    # ordered at least one cold start (+ one decision interval) before the demand needed it
    assert t_need - t_order >= COLD_S + 3.0, (t_need, orders)


def test_reactive_only_orders_the_ramp_after_the_demand():
    orders, need_t, need, _ = run_offline(reactive_only=True)
    level, t_need = _ramp_level(need_t, need)
    t_order, reason = _first_order(orders, level)
    assert reason != Reason.FORECAST
    # a cold start after its order, the replica arrives after the demand did
    assert t_order is not None and t_order + COLD_S > t_need, (t_need, orders)


def test_time_scaled_forecaster_sees_the_series_it_would_see_in_real_time():
    # A daily pattern sampled every 15 min in real time, and the same pattern 240x faster.
    def load(t):
        return 10 + 5 * math.sin(2 * math.pi * t / 86400)

    real = make_forecaster("holt-winters", step_s=900.0)
    fast = TimeScaledForecaster(make_forecaster("holt-winters", step_s=900.0), 240.0)
    for i in range(0, 3 * 96):
        t = i * 900.0
        real.update(t, load(t))
        fast.update(t / 240.0, load(t))
    t_now = 3 * 86400.0
    assert real.ready and fast.ready
    assert fast.forecast(t_now / 240.0, 7200 / 240.0) == pytest.approx(real.forecast(t_now, 7200.0))
    assert fast.forecast_upper(t_now / 240, 30.0) == pytest.approx(real.forecast_upper(t_now, 7200.0))


def test_spec_time_compression_builds_the_forecaster_on_the_load_clock():
    spec = parse_spec({"model": {"builtin": "tiny"},
                       "scaling": {"forecasting": {"forecaster": "holt-winters", "timeCompression": 240}}})
    f = forecaster_from_spec(spec, 3.0)
    assert isinstance(f, TimeScaledForecaster)
    inner = f.inner.base  # QuantileForecaster around Holt-Winters
    # 3 s wall = 12 min of load time; the daily season keeps its 48 half-hour knots
    assert inner.daily.knots == 48 and inner.daily.period_s == 86400.0
    plain = forecaster_from_spec(parse_spec({"model": {"builtin": "tiny"}}), 3.0)
    assert not isinstance(plain, TimeScaledForecaster)
