"""What the observed signals and the forecast ask to serve: the needs now, the forecast's point and upper
terms, and the signal's short trend (a floor under the forecast, and the noise the scale-down tests
against)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from preheat.scaling.policy.signal import concurrency_need, is_valid_signal, replicas_needed
from preheat.scaling.policy.types import Observation, PolicyConfig, PolicyState


@dataclass(frozen=True, slots=True)
class Forecast:
    """The forecast as the decision uses it: point and upper value, and the replicas each needs."""

    value: float | None
    upper: float | None
    need: int
    upper_need: int
    term: int  # what the forecast asks to serve: the point need (the upper need with margin_in_serving)


def forecast_terms(config: PolicyConfig, forecast_value: float | None, forecast_upper: float | None,
                   trend: float | None = None) -> Forecast:
    """The forecast terms: the point forecast (floored by `trend` where given, which stands in for a
    missing one) and the upper one (never below the point), each with the replicas it needs."""
    fv = float(forecast_value) if config.forecasting and is_valid_signal(forecast_value) else None
    if trend is not None and (fv is None or trend > fv):
        fv = trend  # the short trend's floor (`trend_floor`)
    fu = float(forecast_upper) if config.forecasting and is_valid_signal(forecast_upper) else None
    if fu is not None and fv is not None:
        fu = max(fu, fv)
    elif fu is None:
        fu = fv
    need = replicas_needed(fv, config) if fv is not None else 0
    upper_need = replicas_needed(fu, config) if fu is not None else need
    return Forecast(fv, fu, need, upper_need, upper_need if config.margin_serves else need)


def forecast_with_trend(config: PolicyConfig, forecast_value: float | None, forecast_upper: float | None,
                        trend: float | None, ready: bool, lead: float) -> tuple[Forecast, int | None]:
    """(the forecast terms with the short trend, what the forecast alone asks to serve where the trend's
    share must not be held by the scale-down window, else None).

    Without a season the trend floors the point forecast and is held like it (it is the forecast). With
    one, the trend over the lead time is a hedge against a surge the season does not hold, and a hedge
    sits where the forecast's margin sits: where a warm replica pays, it floors the upper forecast (the
    warm margin); otherwise it floors the point forecast, but the replicas only it asks for are not held
    by the scale-down window: a rise that did not come was speculation, and holding it for two lead
    times would pay for it many times over; a rise that came is in the signal, and held as observed.
    Measured (99 %, docs/brain.md): m-small 300 s at 1.0 2104.6 -> 1920.8 h (6.2 % below AIBrix, was
    2.8 % above; 1.17x the oracle, was 1.28x); m-mid 30 s interpolated 2.2 % above AIBrix -> 0.7 % below."""
    if trend is None or not ready:
        return forecast_terms(config, forecast_value, forecast_upper, trend), None
    if config.warm_pays(lead):
        # forecast_terms floors the upper forecast by the point forecast, so an invalid upper one is the
        # trend against the point forecast, as it should be.
        upper = max(trend, float(forecast_upper)) if is_valid_signal(forecast_upper) else trend  # type: ignore[arg-type]
        return forecast_terms(config, forecast_value, upper), None
    fc = forecast_terms(config, forecast_value, forecast_upper, trend)
    alone = forecast_terms(config, forecast_value, forecast_upper).term
    return fc, (alone if fc.term > alone else None)


def trend_floor(config: PolicyConfig, state: PolicyState, obs: Observation, now: float,
                active: bool, lead: float, ready: bool) -> tuple[tuple[tuple[float, float], ...], float | None]:
    """(the signal's recent observations, the short trend's projection or None).

    A least-squares line through the stable-window signal over the last `trend_window_s` (AIBrix's rule;
    at least 3 observations, kept while active: fresh data, forecasting). What it is projected to depends
    on the forecaster (`forecast_with_trend` says how it is used):
    - no season yet (`ready` False: one day or less of history): the forecast is the level, which follows
      a ramp a signal lag late; the line stands in for it, projected by the signal's lag plus one decision
      interval (where the demand is when the next decision can act). deepseek-r1 (one day) at 300 s:
      228.5 -> 202.4 h at 99 %.
    - with its season: the forecast knows the recurring shape, not a surge that is not in it; the line is
      the hedge against that surprise, projected over the lead time (when a replica ordered now serves)."""
    if not (active and config.forecasting and config.trend_window_s > 0.0):
        return (), None
    since = now - config.trend_window_s
    recent = (*(p for p in state.recent_signal if since < p[0] < now), (now, float(obs.value)))  # type: ignore[arg-type]
    if len(recent) < 3:
        return recent, None
    mt, mv, slope = line(recent)
    ahead = now + (lead if ready else config.signal_lag_s + config.decision_interval_s)
    return recent, max(0.0, mv + slope * (ahead - mt))


def line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares line through (time, value) points: (mean time, mean value, slope)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    slope = sum((t - mt) * (v - mv) for t, v in points) / sxx if sxx > 0.0 else 0.0
    return mt, mv, slope


def noise_sigma(points: Sequence[tuple[float, float]]) -> float:
    """The signal's noise: the standard deviation of its residuals around the least-squares line (0 with
    fewer than 3 points). Around the line, not the mean: a ramp is not noise."""
    n = len(points)
    if n < 3:
        return 0.0
    mt, mv, slope = line(points)
    return math.sqrt(sum((v - mv - slope * (t - mt)) ** 2 for t, v in points) / (n - 2))


@dataclass(frozen=True, slots=True)
class Needs:
    """What the observed signals need now (fresh data only)."""

    value: float  # the stable-window signal
    value_panic: float  # the panic-window signal
    reactive: int  # replicas the stable-window signal needs
    panic: int  # replicas the panic window (or the requests present) needs
    waiting: float  # requests waiting for a slot
    present: int  # replicas whose slots hold every request present now
    base: int  # what serves now, at least one: the reference for panic and scale-up rates


def needs_now(config: PolicyConfig, obs: Observation, current: int, warm_ready: int) -> Needs:
    """What the observed signals and the requests present need now (fresh data only)."""
    value = float(obs.value)  # type: ignore[arg-type]  # checked by the caller
    value_panic = float(obs.value_panic) if is_valid_signal(obs.value_panic) else value
    reactive_need = replicas_needed(value, config)
    panic_need = replicas_needed(value_panic, config)
    waiting, present_need = concurrency_need(config, obs)
    base = max(current, 1)
    # Requests queued now are served within seconds by promoted warm replicas; a cold start lands
    # after the burst. So the queue promotes the warm pool, and orders cold starts only up to
    # queue_cold_start_rate x what serves now (0: the rate signals alone order cold starts).
    extra = config.queue_cold_start_rate * base
    present_need = min(present_need, current + warm_ready + (math.ceil(extra) if extra < 1e12 else 10**12))
    panic_need = max(panic_need, present_need)
    return Needs(value, value_panic, reactive_need, panic_need, waiting, present_need, base)
