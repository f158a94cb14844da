"""The pure scaling decision: observation and forecast in, desired serving replicas and warm pool out.

Shaped after Knative's decider (knative/serving pkg/autoscaler/scaling/autoscaler.go): need from a
stable-window signal, a panic mode on a short window, max scale-up/-down rates. Added for model
inference: a forecast term at now + lead time (lead time >= the measured cold start; serving is sized
by the point forecast at the target utilization, whose 1 - U is the serving headroom), a warm pool
sized by the forecast's upper quantile where a warm replica is cheaper than a serving one, an
HPA-style scale-down stabilization window, and a hold on missing data. Every decision is an absolute count (never "current x factor"), so pods that are
still starting are not counted twice and there is no 2 -> 4 -> 8 cascade.
"""

from __future__ import annotations

import math
from dataclasses import replace

from preheat.scaling.policy.scale_down import (
    held_recommendation,
    noise_floor,
    resume_after_gap,
    stabilization_window_s,
    stabilize,
)
from preheat.scaling.policy.signal import (
    concurrency_need,
    finite,
    fmt,
    is_valid_signal,
    lead_time_s,
    measured_cold_starts,
    replicas_needed,
    sanitize_count,
)
from preheat.scaling.policy.terms import Forecast, Needs, forecast_with_trend, needs_now, trend_floor
from preheat.scaling.policy.types import Decision, Observation, PolicyConfig, PolicyState, Reason
from preheat.scaling.policy.warm import apply_burst, burst_envelope, warm_pool
from preheat.scaling.policy.zero import bound, idle_forecast, scale_to_zero


def decide(
    config: PolicyConfig,
    state: PolicyState,
    obs: Observation,
    forecast_value: float | None = None,
    forecast_upper: float | None = None,
    ready: bool = True,
    seasonal: bool = False,
) -> tuple[Decision, PolicyState]:
    """One scaling decision. Pure: the same inputs always give the same (Decision, PolicyState).

    `forecast_value` is the point forecast of the signal over the lead time (the Autoscaler passes the
    peak of the forecast between now and now + lead time) and `forecast_upper` its upper quantile.
    Never raises on bad observations: missing, stale, NaN or negative data gives a `hold` decision.
    `ready` says whether the forecaster has its full model (the Autoscaler passes its forecaster's
    `ready`) and `seasonal` whether that model knows the load's season: see `decide_measured`.
    """
    measured, lead = measured_cold_starts(config, obs.cold_start_samples_s, state.cold_start_samples_s)
    return decide_measured(config, state, obs, forecast_value, forecast_upper, measured, lead, ready, seasonal)


def decide_measured(
    config: PolicyConfig,
    state: PolicyState,
    obs: Observation,
    forecast_value: float | None,
    forecast_upper: float | None,
    measured: tuple[float, ...],
    lead: float,
    ready: bool = True,
    seasonal: bool = False,  # a ready model that knows the season: a one-lead-time hold (`hold_lead_times`)
) -> tuple[Decision, PolicyState]:
    """`decide` with the cleaned cold-start samples and the lead time already worked out.

    `ready=False` (the forecaster has no season yet: its forecast is the level) keeps the upper quantile
    out of the warm pool (a spread the headroom 1 - U already prices; the queue's promotions still go
    back there where a warm one pays), and the signal's short trend stands in for the forecast (`trend_floor`);
    with `ready` the trend over the lead time is a hedge the scale-down window does not hold (`forecast_with_trend`).
    `(measured, lead)` must be `measured_cold_starts(config, obs.cold_start_samples_s,
    state.cold_start_samples_s)`: the Autoscaler needs the lead time for the forecast horizon first.
    """
    now = float(obs.time_s) if finite(obs.time_s) else math.nan
    current = sanitize_count(obs.current_serving)
    warm_ready = sanitize_count(obs.warm_ready)
    prev_serving = state.last_serving if state.last_serving is not None else current
    prev_warm = state.last_warm if state.last_warm is not None else warm_ready
    data_ok = math.isfinite(now) and not obs.stale and is_valid_signal(obs.value)
    recent, trend = trend_floor(config, state, obs, now, data_ok, lead, ready)
    fc, unheld = forecast_with_trend(config, forecast_value, forecast_upper, trend, ready, lead)
    margin_need = fc.upper_need if ready else fc.need
    if not data_ok:
        return _hold(config, state, obs, now, lead, measured, current, warm_ready, prev_serving, prev_warm,
                     fc.value, fc.upper, fc.term, margin_need)

    serving_recs, total_recs = resume_after_gap(config, state, now)
    needs = needs_now(config, obs, current, warm_ready)
    panic_since, panic_last_over, panic_max = _panic_window(config, state, now, needs, current)
    in_panic = panic_since is not None
    notes: list[str] = []
    window = stabilization_window_s(config, lead, seasonal)
    pays = config.warm_pays(lead)
    # Where a warm replica pays and the queue is seen, replicas promoted for a queue are the pool's, on loan.
    lend = pays and config.concurrency_per_replica is not None
    recommendation, reason, panic_max = _recommend(config, needs, fc, current, in_panic, panic_max, notes, lend)

    held_rec = held_recommendation(config, needs, fc, recommendation, in_panic, pays)
    if unheld is not None:  # the trend's hedge is not held: only what was observed or forecast is
        held_rec = min(held_rec, max(needs.reactive, unheld, needs.panic if in_panic else 0))
    serving_queue = serving_recs.record(now, held_rec, window)
    serving, reason = stabilize(config, serving_queue, now, window, recommendation, reason, current, notes)
    serving, reason = noise_floor(config, recent, needs, fc, current, serving, reason, notes)
    zero_since, to_zero = scale_to_zero(config, state, now, needs, fc.upper, serving, in_panic, notes)
    serving, reason = bound(config, serving, reason, to_zero, notes)

    # What serves for the rate signals and the forecast (the window's held recommendations): replicas
    # serving beyond it were promoted from the warm pool because requests queued, and are on loan.
    held = min(serving, serving_queue.max(now, window) or serving)
    warm, total_queue = warm_pool(config, total_recs, now, serving, margin_need, window, pays, held, recommendation)
    burst_queue, burst_need = burst_envelope(config, state.burst_needs, now, needs, current)
    warm, reason = apply_burst(config, serving, warm, burst_need, reason, prev_serving, prev_warm, notes)

    detail = (
        f"{reason}: signal {fmt(needs.value)} (panic window {fmt(needs.value_panic)}) needs {needs.reactive}; "
        f"{_present(obs, needs.waiting, needs.present)}"
        f"forecast {fmt(fc.value)} (upper {fmt(fc.upper)}) within {lead:.0f}s lead time needs {fc.need} "
        f"(upper {fc.upper_need}); serving {current} -> {serving}, warm pool {prev_warm} -> {warm}"
        + (" [panic]" if in_panic else "")
        + ("; " + "; ".join(notes) if notes else "")
    )
    decision = Decision(
        serving=serving, warm=warm, reason=reason, detail=detail, reactive_need=needs.reactive,
        forecast_need=fc.need, panic_need=needs.panic, forecast_value=fc.value, forecast_upper=fc.upper,
        lead_time_s=lead, panic=in_panic, promote=min(max(0, serving - current), warm_ready), time_s=now,
    )
    new_state = PolicyState(
        last_serving=serving, last_warm=warm, panic_since=panic_since, panic_last_over=panic_last_over,
        panic_max=panic_max, zero_since=zero_since, serving_recommendations=serving_queue,
        total_recommendations=total_queue, cold_start_samples_s=measured, last_data_s=now,
        burst_needs=burst_queue, recent_signal=recent,
    )
    return decision, new_state


def _recommend(
    config: PolicyConfig, needs: Needs, fc: Forecast, current: int, in_panic: bool, panic_max: int,
    notes: list[str], lend: bool = False,
) -> tuple[int, Reason, int]:
    """(unstabilized recommendation, its reason, panic max): the larger of the reactive and forecast
    needs, in panic never below what was asked since it began, capped by the scale-up rate.

    With `lend` (a warm replica pays and the queue is seen) panic asks for what the requests present
    need now, not for the most since it began: Knative never scales down in panic because capacity
    given back takes a cold start to return, but a replica the queue promoted goes back to the warm
    pool and returns in seconds."""
    recommendation = max(needs.reactive, fc.term)
    reason = Reason.FORECAST if fc.term > needs.reactive else Reason.REACTIVE
    if in_panic:
        # In panic never scale down: keep the highest of the panic need, what we asked for since
        # panic began and what serves now.
        panicked = needs.panic if lend else max(needs.panic, panic_max, current)  # lend: see above
        if panicked > recommendation:
            recommendation, reason = panicked, Reason.PANIC
        panic_max = max(panic_max, recommendation)
    up_cap = math.ceil(config.max_scale_up_rate * needs.base)
    if recommendation > up_cap:
        recommendation = up_cap
        notes.append(f"capped by max scale-up rate {config.max_scale_up_rate:g}x to {up_cap}")
    return recommendation, reason, panic_max


def _panic_window(
    config: PolicyConfig, state: PolicyState, now: float, needs: Needs, current: int
) -> tuple[float | None, float | None, int]:
    """(panic since, last time over the threshold, highest recommendation since panic began).

    Panic (Knative): the short-window need is at least panic_threshold x what serves now. Measured
    against current serving, with at least one, so a burst at zero replicas also panics. With
    concurrency counts, requests waiting while the slots of what serves now are full also panic:
    the queue sees a burst within one scrape, a rate window only after it has mostly passed.
    """
    over_threshold = needs.panic / needs.base >= config.panic_threshold or (
        needs.waiting > 0 and needs.present > current)
    panic_since, panic_last_over, panic_max = state.panic_since, state.panic_last_over, state.panic_max
    if over_threshold:
        if panic_since is None:
            panic_since, panic_max = now, 0
        panic_last_over = now
    elif panic_since is not None and (panic_last_over is None or now - panic_last_over >= config.stable_window_s):
        panic_since, panic_last_over, panic_max = None, None, 0
    return panic_since, panic_last_over, panic_max


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
    if config.concurrency_per_replica is None or obs.stale or not finite(obs.time_s):
        return None, state
    now = float(obs.time_s)
    waiting, present_need = concurrency_need(config, obs)
    current = sanitize_count(obs.current_serving)
    ready = sanitize_count(obs.serving_ready)
    warm_ready = sanitize_count(obs.warm_ready)
    prev_serving = state.last_serving if state.last_serving is not None else current
    prev_warm = state.last_warm if state.last_warm is not None else warm_ready
    # What the requests present now need beyond the Ready serving replicas, from Ready warm ones.
    promote = min(max(0, present_need - ready), warm_ready, prev_warm)
    if waiting <= 0 or promote <= 0:
        return None, state
    total = min(prev_serving + prev_warm, config.max_replicas)
    serving = min(max(prev_serving, current) + promote, total)
    # Nothing to do unless a warm replica actually moves: serving above both the last decision and what
    # serves now (an observation can show more serving pods than the last decision asked for).
    if serving <= max(prev_serving, current):
        return None, state
    warm = total - serving
    panic_since = state.panic_since if state.panic_since is not None else now
    detail = (
        f"{Reason.PANIC}: {fmt(obs.running)} running + {fmt(waiting)} waiting need {present_need} with "
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


def _present(obs: Observation, waiting: float, need: int) -> str:
    if not need:
        return ""
    return f"{fmt(obs.running)} running + {fmt(waiting)} waiting need {need}; "


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
    # at zero the forecast wakes the endpoint by the same test that let it go there (else it flaps:
    # a forecast of a fraction of a replica needs one, and the replica's first fresh sample is zero)
    asleep = serving == 0 and config.scale_to_zero and idle_forecast(config, fu)
    if forecast_term > serving and not asleep:
        serving, reason = forecast_term, Reason.FORECAST
    lo = config.min_replicas if (config.scale_to_zero and serving == 0) else config.floor_replicas
    clamped = min(max(serving, lo), config.max_replicas)
    if clamped != serving:
        serving, reason = clamped, Reason.BOUNDS
    if serving == 0:
        warm = 0
    else:
        extra = max(0, upper_need - serving) if config.warm_pays(lead) else 0
        warm = max(prev_warm, min(config.warm_pool_min + extra, config.warm_pool_max))
        warm = max(0, min(warm, config.warm_pool_max, config.max_replicas - serving))
    decision = Decision(
        serving=serving,
        warm=warm,
        reason=reason,
        detail=(
            f"{reason}: {why}; holding serving {prev_serving} (current {current}) -> {serving}, "
            f"warm pool {prev_warm} -> {warm}; forecast {fmt(fv)} (upper {fmt(fu)}) within {lead:.0f}s"
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
