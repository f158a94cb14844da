"""The pure scaling decision: observation and forecast in, desired serving replicas and warm pool out.

Shaped after Knative's decider (knative/serving pkg/autoscaler/scaling/autoscaler.go): need from a
stable-window signal, a panic mode on a short window, max scale-up/-down rates. Added for model
inference: a forecast term at now + lead time (lead time >= the measured cold start), a warm pool
sized by the forecast's upper quantile, an HPA-style scale-down stabilisation window, and a hold on
missing data. Every decision is an absolute count (never "current x factor"), so pods that are
still starting are not counted twice and there is no 2 -> 4 -> 8 cascade.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from preheat.scaling.policy.types import Decision, Observation, PolicyConfig, PolicyState, Reason

# Absorbs float noise in signal / capacity (e.g. 2.0000000001 must need 2 replicas, not 3).
_EPS = 1e-9


def is_valid_signal(value: object) -> bool:
    """A usable signal value: a finite, non-negative number (None, NaN, inf, negatives are missing)."""
    if value.__class__ is float or value.__class__ is int:  # the hot path: plain numbers
        return 0.0 <= value < math.inf  # type: ignore[operator]  # False for NaN too
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value >= 0.0


def replicas_needed(value: float, config: PolicyConfig) -> int:
    """Serving replicas that carry `value` at the target utilization (0 for no traffic)."""
    if not is_valid_signal(value) or value <= 0.0:
        return 0
    ratio = value / config.capacity_per_replica
    if ratio > 1e12:  # absurd input; keep ints bounded
        return 10**12
    return max(0, math.ceil(ratio - _EPS))


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated sample quantile (numpy's default method), without numpy."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("quantile of no samples")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def clean_cold_starts(samples: Sequence[float] | None) -> tuple[float, ...]:
    """Keep the usable start-to-ready durations (finite, non-negative)."""
    if not samples:
        return ()
    return tuple(float(s) for s in samples if is_valid_signal(s))


def cold_start_s(config: PolicyConfig, samples: Sequence[float] | None) -> float:
    """The cold start to plan for: the configured quantile (p90) of measured ones, else the default."""
    clean = clean_cold_starts(samples)
    if not clean:
        return config.default_cold_start_s
    return quantile(clean, config.cold_start_quantile)


def lead_time_s(config: PolicyConfig, samples: Sequence[float] | None) -> float:
    """How far ahead capacity must be decided: p90 cold start + one decision interval + the signal's lag.

    A replica asked for now is only counted on the next decision and then needs a cold start to be
    Ready; and the demand the decision sees is already half a rate window plus a scrape old
    (`signal_lag_s`). So the forecast that matters is the one at now + all three.
    `horizon_override_s` replaces it when set.
    """
    if config.horizon_override_s is not None:
        return float(config.horizon_override_s)
    return cold_start_s(config, samples) + config.decision_interval_s + config.signal_lag_s


REACTIVE_STABILISATION_S = 300.0  # HPA's default scale-down stabilisation, for a policy without forecasts


def stabilisation_window_s(config: PolicyConfig, lead: float) -> float:
    """The scale-down stabilisation window: the configured one, else HPA's 300 s, and when forecasting
    never shorter than the lead time (capacity given back now cannot be back sooner). 300 s stays the
    floor: on noisy traffic a shorter window gives capacity back on every dip (tried: with a 30 s cold
    start, a 90 s window cost more and attained less on deepseek-r1 than 300 s)."""
    if config.scale_down_stabilization_s is not None:
        return float(config.scale_down_stabilization_s)
    return max(lead, REACTIVE_STABILISATION_S) if config.forecasting else REACTIVE_STABILISATION_S


def measured_cold_starts(
    config: PolicyConfig, samples: Sequence[float] | None, remembered: tuple[float, ...]
) -> tuple[tuple[float, ...], float]:
    """(cold-start samples to plan with, lead time): this observation's usable samples, else the
    remembered ones. Validates and sorts the samples once (the hot path of every decision)."""
    clean = clean_cold_starts(samples)
    if not clean:
        return remembered, lead_time_s(config, remembered)
    if config.horizon_override_s is not None:
        return clean, float(config.horizon_override_s)
    return clean, quantile(clean, config.cold_start_quantile) + config.decision_interval_s + config.signal_lag_s


def _push_max_queue(
    queue: tuple[tuple[float, int], ...], now: float, value: int, window_s: float
) -> tuple[tuple[float, int], ...]:
    """Append (now, value) to a monotone max-queue and drop entries outside the window.

    Entries older than the window, from the future (clock went backwards), or dominated by the new
    value (older and not larger) can never be the window's maximum again.
    """
    kept = [(t, v) for t, v in queue if now - window_s < t <= now and v > value]
    kept.append((now, value))
    return tuple(kept)


def _window_max(queue: tuple[tuple[float, int], ...], now: float, window_s: float) -> int | None:
    values = [v for t, v in queue if now - window_s < t <= now]
    return max(values) if values else None


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


def _sanitize_count(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n):
        return 0
    return max(0, int(n))


def decide(
    config: PolicyConfig,
    state: PolicyState,
    obs: Observation,
    forecast_value: float | None = None,
    forecast_upper: float | None = None,
) -> tuple[Decision, PolicyState]:
    """One scaling decision. Pure: the same inputs always give the same (Decision, PolicyState).

    `forecast_value` is the point forecast of the signal over the lead time (the Autoscaler passes the
    peak of the forecast between now and now + lead time) and `forecast_upper` its upper quantile.
    Never raises on bad observations: missing, stale, NaN or negative data gives a `hold` decision.
    """
    measured, lead = measured_cold_starts(config, obs.cold_start_samples_s, state.cold_start_samples_s)
    return decide_measured(config, state, obs, forecast_value, forecast_upper, measured, lead)


def decide_measured(
    config: PolicyConfig,
    state: PolicyState,
    obs: Observation,
    forecast_value: float | None,
    forecast_upper: float | None,
    measured: tuple[float, ...],
    lead: float,
) -> tuple[Decision, PolicyState]:
    """`decide` with the cleaned cold-start samples and the lead time already worked out.

    The Autoscaler needs both before deciding (the lead time sets the forecast horizon), so it
    passes them in instead of having every step validate and sort the samples twice.
    `(measured, lead)` must be `measured_cold_starts(config, obs.cold_start_samples_s,
    state.cold_start_samples_s)`.
    """
    now = float(obs.time_s) if _finite(obs.time_s) else math.nan
    current = _sanitize_count(obs.current_serving)
    warm_ready = _sanitize_count(obs.warm_ready)
    prev_serving = state.last_serving if state.last_serving is not None else current
    prev_warm = state.last_warm if state.last_warm is not None else warm_ready

    fv = float(forecast_value) if config.forecasting and is_valid_signal(forecast_value) else None
    fu = float(forecast_upper) if config.forecasting and is_valid_signal(forecast_upper) else None
    if fu is not None and fv is not None:
        fu = max(fu, fv)
    elif fu is None:
        fu = fv
    forecast_need = replicas_needed(fv, config) if fv is not None else 0
    upper_need = replicas_needed(fu, config) if fu is not None else forecast_need
    forecast_term = upper_need if config.margin_serves else forecast_need

    data_ok = math.isfinite(now) and not obs.stale and is_valid_signal(obs.value)
    if not data_ok:
        return _hold(config, state, obs, now, lead, measured, current, warm_ready, prev_serving, prev_warm,
                     fv, fu, forecast_term, upper_need)

    value = float(obs.value)  # type: ignore[arg-type]
    serving_recs, total_recs = _resume_after_gap(config, state, now)
    value_panic = float(obs.value_panic) if is_valid_signal(obs.value_panic) else value
    reactive_need = replicas_needed(value, config)
    panic_need = replicas_needed(value_panic, config)
    waiting, present_need = _concurrency_need(config, obs)
    base = max(current, 1)
    # Requests queued now are served within seconds by promoted warm replicas; a cold start lands
    # after the burst. So the queue promotes the warm pool, and orders cold starts only up to
    # queue_cold_start_rate x what serves now (0: the rate signals alone order cold starts).
    extra = config.queue_cold_start_rate * base
    present_need = min(present_need, current + warm_ready + (math.ceil(extra) if extra < 1e12 else 10**12))
    panic_need = max(panic_need, present_need)

    # Panic (Knative): the short-window need is at least panic_threshold x what serves now. Measured
    # against current serving, with at least one, so a burst at zero replicas also panics. With
    # concurrency counts, requests waiting while the slots of what serves now are full also panic:
    # the queue sees a burst within one scrape, a rate window only after it has mostly passed.
    over_threshold = panic_need / base >= config.panic_threshold or (waiting > 0 and present_need > current)
    panic_since, panic_last_over, panic_max = state.panic_since, state.panic_last_over, state.panic_max
    if over_threshold:
        if panic_since is None:
            panic_since, panic_max = now, 0
        panic_last_over = now
    elif panic_since is not None and (panic_last_over is None or now - panic_last_over >= config.stable_window_s):
        panic_since, panic_last_over, panic_max = None, None, 0
    in_panic = panic_since is not None

    recommendation = max(reactive_need, forecast_term)
    reason = Reason.FORECAST if forecast_term > reactive_need else Reason.REACTIVE
    notes: list[str] = []
    if in_panic:
        # In panic never scale down: keep the highest of the panic need, what we asked for since
        # panic began and what serves now.
        panicked = max(panic_need, panic_max, current)
        if panicked > recommendation:
            recommendation, reason = panicked, Reason.PANIC
        panic_max = max(panic_max, recommendation)

    up_cap = math.ceil(config.max_scale_up_rate * base)
    if recommendation > up_cap:
        recommendation = up_cap
        notes.append(f"capped by max scale-up rate {config.max_scale_up_rate:g}x to {up_cap}")

    # Scale-down stabilisation (HPA): the highest recommendation within the window wins.
    window = stabilisation_window_s(config, lead)
    serving_queue = _push_max_queue(serving_recs, now, recommendation, window)
    serving = recommendation
    stabilised = _window_max(serving_queue, now, window) or 0
    if stabilised > serving:
        serving, reason = stabilised, Reason.STABILISATION
        notes.append(f"highest recommendation in the last {window:g}s is {stabilised}")
    rate_floor = math.floor(current / config.max_scale_down_rate)
    if serving < rate_floor:
        serving, reason = rate_floor, Reason.STABILISATION
        notes.append(f"max scale-down rate {config.max_scale_down_rate:g} allows no fewer than {rate_floor}")

    # Scale to zero: zero traffic for the grace period and no traffic forecast within the lead time.
    zero_since = state.zero_since
    to_zero = False
    if config.scale_to_zero and config.min_replicas == 0:
        if value == 0.0 and value_panic == 0.0:
            zero_since = now if zero_since is None else zero_since
        else:
            zero_since = None
        idle_forecast = fu is None or fu < config.idle_forecast_fraction * config.capacity_per_replica
        if zero_since is not None and now - zero_since >= config.scale_to_zero_grace_s and idle_forecast:
            to_zero = not in_panic
        elif serving == 0 and zero_since is not None:
            notes.append(
                f"zero traffic for {now - zero_since:.0f}s of a {config.scale_to_zero_grace_s:g}s grace"
                if idle_forecast
                else f"forecast upper {_fmt(fu)} says traffic comes within the lead time"
            )
    else:
        zero_since = None

    if to_zero:
        serving, reason = 0, Reason.SCALE_TO_ZERO
    else:
        lo = config.floor_replicas
        if serving < lo and config.scale_to_zero and config.min_replicas == 0:
            # waiting out the grace (or the forecast): keep one replica, by stabilisation not bounds
            serving, reason = lo, Reason.STABILISATION
        clamped = min(max(serving, lo), config.max_replicas)
        if clamped != serving:
            notes.append(f"clamped to [{lo}, {config.max_replicas}]")
            serving, reason = clamped, Reason.BOUNDS

    warm, total_queue = _warm_pool(config, total_recs, now, serving, upper_need, window)
    # Burst envelope: on bursty traffic keep serving + warm at the highest short-window need of the
    # last burst_memory_s (the warm pool is promoted in seconds when the next burst queues).
    burst_queue, burst_need = state.burst_needs, 0
    if config.burst_memory_s > 0.0:
        bursty = panic_need >= config.burst_threshold * max(reactive_need, 1) or (waiting > 0 and present_need > current)
        burst_queue = _push_max_queue(burst_queue, now, panic_need, config.burst_memory_s) if bursty else tuple(
            (t, v) for t, v in burst_queue if now - config.burst_memory_s < t <= now)
        burst_need = _window_max(burst_queue, now, config.burst_memory_s) or 0
    burst_warm = 0
    if serving > 0 and burst_need > serving:
        burst_warm = max(0, min(burst_need - serving, config.warm_pool_max, config.max_replicas - serving))
    by_burst = burst_warm > warm
    if by_burst:
        warm = burst_warm
        notes.append(f"burst envelope: short-window need {burst_need} within the last {config.burst_memory_s:g}s")
    steady = reason in (Reason.REACTIVE, Reason.FORECAST, Reason.STABILISATION) and serving == prev_serving
    if steady and by_burst:
        reason = Reason.BURST  # serving holds; the burst envelope sets the Deployment's total
    elif steady and warm != prev_warm:
        reason = Reason.WARM_POOL

    detail = (
        f"{reason}: signal {_fmt(value)} (panic window {_fmt(value_panic)}) needs {reactive_need}; "
        f"{_present(obs, waiting, present_need)}"
        f"forecast {_fmt(fv)} (upper {_fmt(fu)}) within {lead:.0f}s lead time needs {forecast_need} "
        f"(upper {upper_need}); serving {current} -> {serving}, warm pool {prev_warm} -> {warm}"
        + (" [panic]" if in_panic else "")
        + ("; " + "; ".join(notes) if notes else "")
    )
    decision = Decision(
        serving=serving,
        warm=warm,
        reason=reason,
        detail=detail,
        reactive_need=reactive_need,
        forecast_need=forecast_need,
        panic_need=panic_need,
        forecast_value=fv,
        forecast_upper=fu,
        lead_time_s=lead,
        panic=in_panic,
        promote=min(max(0, serving - current), warm_ready),
        time_s=now,
    )
    new_state = PolicyState(
        last_serving=serving,
        last_warm=warm,
        panic_since=panic_since,
        panic_last_over=panic_last_over,
        panic_max=panic_max,
        zero_since=zero_since,
        serving_recommendations=serving_queue,
        total_recommendations=total_queue,
        cold_start_samples_s=measured,
        last_data_s=now,
        burst_needs=burst_queue,
    )
    return decision, new_state


def decide_panic(config: PolicyConfig, state: PolicyState, obs: Observation) -> tuple[Decision | None, PolicyState]:
    """The fast panic path between full decisions: requests waiting promote Ready warm replicas.

    Run every `panic_interval_s` on the model server's gauges alone (`queue`, `running`,
    `current_serving`, `warm_ready`; `value` is not needed). When requests wait while the slots of
    what serves now are full, up to that many Ready warm replicas move to serving; the Deployment's
    total stays what the last decision asked for, so nothing starts cold and nothing is removed,
    and panic is entered so the next full decision does not scale serving back down. Returns
    (None, state) when there is nothing to promote (also on a missing, stale or invalid count or
    time, and without `concurrency_per_replica`): the caller does nothing. Pure, like `decide`.
    """
    if config.concurrency_per_replica is None or obs.stale or not _finite(obs.time_s):
        return None, state
    now = float(obs.time_s)
    waiting, present_need = _concurrency_need(config, obs)
    current = _sanitize_count(obs.current_serving)
    ready = _sanitize_count(obs.serving_ready)
    warm_ready = _sanitize_count(obs.warm_ready)
    prev_serving = state.last_serving if state.last_serving is not None else current
    prev_warm = state.last_warm if state.last_warm is not None else warm_ready
    # What the requests present now need beyond the Ready serving replicas, from Ready warm ones.
    promote = min(max(0, present_need - ready), warm_ready, prev_warm)
    if waiting <= 0 or promote <= 0:
        return None, state
    total = min(prev_serving + prev_warm, config.max_replicas)
    serving = min(max(prev_serving, current) + promote, total)
    if serving <= prev_serving:
        return None, state
    warm = total - serving
    panic_since = state.panic_since if state.panic_since is not None else now
    detail = (
        f"{Reason.PANIC}: {_fmt(obs.running)} running + {_fmt(waiting)} waiting need {present_need} with "
        f"{ready} serving Ready; fast path promotes {promote} of {warm_ready} Ready warm replica(s): "
        f"serving {prev_serving} -> {serving}, warm pool {prev_warm} -> {warm} [panic]"
    )
    decision = Decision(
        serving=serving, warm=warm, reason=Reason.PANIC, detail=detail, panic_need=present_need,
        lead_time_s=lead_time_s(config, state.cold_start_samples_s), panic=True,
        promote=min(max(0, serving - current), warm_ready), time_s=now,
    )
    new_state = replace(
        state, last_serving=serving, last_warm=warm, panic_since=panic_since, panic_last_over=now,
        panic_max=max(state.panic_max, serving),
    )
    return decision, new_state


def _resume_after_gap(
    config: PolicyConfig, state: PolicyState, now: float
) -> tuple[tuple[tuple[float, int], ...], tuple[tuple[float, int], ...]]:
    """The stabilisation queues, with a data gap taken out of their age.

    Missing data holds the fleet, and the first windows after a metrics outage are partial (a
    rate() over a window that is mostly gap, a logging pipeline catching up). If the gap aged the
    recommendations made before it, the first fresh sample would let the fleet drop at once to
    whatever that partial window shows, just before traffic that never went away is seen again.
    So the windows count observed time: entries made before the gap are shifted forward by the gap
    (beyond one decision interval), and a recovered pipeline has to show a full stabilisation
    window of lower demand before the fleet shrinks.
    """
    last = state.last_data_s
    gap = now - last - config.decision_interval_s if last is not None and math.isfinite(last) else 0.0
    if not gap > 0.0:
        return state.serving_recommendations, state.total_recommendations

    def shift(q: tuple[tuple[float, int], ...]) -> tuple[tuple[float, int], ...]:
        return tuple((min(t + gap, now), v) for t, v in q)

    return shift(state.serving_recommendations), shift(state.total_recommendations)


def _concurrency_need(config: PolicyConfig, obs: Observation) -> tuple[float, int]:
    """(waiting requests, serving replicas whose slots hold every request present now).

    (0, 0) unless `concurrency_per_replica` is configured and the observation has the running or
    waiting count; a missing or invalid count is read as 0 (never an exception, never a scale-down:
    this term only ever raises the panic need).
    """
    slots = config.concurrency_per_replica
    if slots is None:
        return 0.0, 0
    running = float(obs.running) if is_valid_signal(obs.running) else 0.0  # type: ignore[arg-type]
    waiting = float(obs.queue) if is_valid_signal(obs.queue) else 0.0  # type: ignore[arg-type]
    present = running + waiting
    if present <= 0.0:
        return waiting, 0
    return waiting, min(10**12, max(0, math.ceil(present / slots - _EPS)))


def _present(obs: Observation, waiting: float, need: int) -> str:
    if not need:
        return ""
    return f"{_fmt(obs.running)} running + {_fmt(waiting)} waiting need {need}; "


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _warm_pool(
    config: PolicyConfig,
    total_recs: tuple[tuple[float, int], ...],
    now: float,
    serving: int,
    upper_need: int,
    window: float,
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """Warm pool = configured minimum + the forecast's burst margin (upper need beyond serving).

    The total (serving + warm) is stabilised like serving, so replicas freed from serving are demoted
    to the warm pool for the window instead of being deleted and cold-started again. Capped by
    warm_pool_max and by max_replicas - serving (max_replicas bounds the Deployment).
    """
    if serving == 0:
        return 0, _push_max_queue(total_recs, now, 0, window)
    extra = 0 if config.margin_serves else max(0, upper_need - serving)
    warm_rec = min(config.warm_pool_min + extra, config.warm_pool_max)
    total_rec = serving + warm_rec
    total_queue = _push_max_queue(total_recs, now, total_rec, window)
    stabilised_total = _window_max(total_queue, now, window) or total_rec
    warm = max(warm_rec, min(stabilised_total - serving, config.warm_pool_max))
    warm = max(0, min(warm, config.max_replicas - serving))
    return warm, total_queue


def _hold(
    config: PolicyConfig,
    state: PolicyState,
    obs: Observation,
    now: float,
    lead: float,
    measured: tuple[float, ...],
    current: int,
    warm_ready: int,
    prev_serving: int,
    prev_warm: int,
    fv: float | None,
    fu: float | None,
    forecast_term: int,
    upper_need: int,
) -> tuple[Decision, PolicyState]:
    """Missing, stale or invalid data: never scale down; the forecast may still scale up.

    A failing metrics pipeline must not block scaling entirely (a complaint users raise about
    reactive autoscalers), so a forecast above what we hold still pre-scales; nothing scales down.
    """
    why = "stale metrics" if obs.stale else f"no usable signal ({obs.value!r})"
    if not math.isfinite(now):
        why = f"invalid time {obs.time_s!r}"
    serving = max(prev_serving, current)
    reason = Reason.HOLD
    if forecast_term > serving:
        serving, reason = forecast_term, Reason.FORECAST
    lo = config.min_replicas if (config.scale_to_zero and serving == 0) else config.floor_replicas
    clamped = min(max(serving, lo), config.max_replicas)
    if clamped != serving:
        serving, reason = clamped, Reason.BOUNDS
    if serving == 0:
        warm = 0
    else:
        extra = 0 if config.margin_serves else max(0, upper_need - serving)
        warm = max(prev_warm, min(config.warm_pool_min + extra, config.warm_pool_max))
        warm = max(0, min(warm, config.warm_pool_max, config.max_replicas - serving))
    decision = Decision(
        serving=serving,
        warm=warm,
        reason=reason,
        detail=(
            f"{reason}: {why}; holding serving {prev_serving} (current {current}) -> {serving}, "
            f"warm pool {prev_warm} -> {warm}; forecast {_fmt(fv)} (upper {_fmt(fu)}) within {lead:.0f}s"
        ),
        reactive_need=0,
        forecast_need=replicas_needed(fv, config) if fv is not None else 0,
        panic_need=0,
        forecast_value=fv,
        forecast_upper=fu,
        lead_time_s=lead,
        panic=state.panic_since is not None,
        promote=min(max(0, serving - current), warm_ready),
        time_s=now if math.isfinite(now) else 0.0,
    )
    # Windows are not advanced on missing data: a hold is not a recommendation. Everything else the
    # policy remembers (the burst envelope included) is kept as it was: `replace`, never a rebuild,
    # so a field added to PolicyState cannot be dropped here by omission.
    new_state = replace(state, last_serving=serving, last_warm=warm, cold_start_samples_s=tuple(measured))
    return decision, new_state
