"""When serving capacity may be given back: the scale-down stabilization window (a hold priced like ski
rental), the noise floor under a scale-down, what the window remembers, and windows that count observed
time across a data gap."""

from __future__ import annotations

import math
from collections.abc import Sequence

from preheat.scaling.policy.signal import fmt, replicas_needed
from preheat.scaling.policy.terms import Forecast, Needs, noise_sigma
from preheat.scaling.policy.types import PolicyConfig, PolicyState, Reason
from preheat.scaling.policy.window import TimeWindow

REACTIVE_STABILIZATION_S = 300.0  # HPA's default scale-down stabilization, for a policy without forecasts


def stabilization_window_s(config: PolicyConfig, lead: float, seasonal: bool = False) -> float:
    """The scale-down stabilization window: the configured one, else HPA's 300 s; when forecasting,
    `hold_lead_times(config, seasonal)` lead times (two at U = 1, one once the forecaster has its
    season; at least the stable window), and at least 300 s where the noise floor is off.

    A replica given back now costs, if it is needed again, a lead time of replica-seconds billed while
    it starts plus a lead time of demand it cannot serve; holding it costs its price per second. So
    hold it (rent) for about what getting it back costs (buy): the ski-rental rule.
    Measured on the frontier at a 300 s cold start (lead 360 s, window 720 s instead of 360 s): m-mid
    at 99 % 12.7 % below the best baseline instead of 0.9 % above; deepseek-r1, m-small and mooncake
    within 2 % of the shorter window.
    With short cold starts two lead times is 180-200 s, and a window that short alone gives capacity
    back on every noise dip (deepseek-r1, 30 s: 3.6 % above KEDA at 99 % instead of 4.5 % below);
    HPA's 300 s used to be the floor for that, and kept every real step down (a 10-minute window of a
    smooth series) for minutes too. The noise floor (`noise_floor`) tells the two apart instead: a
    dip within the signal's own noise is held, a drop beyond it is given back after the window."""
    if config.scale_down_stabilization_s is not None:
        return float(config.scale_down_stabilization_s)
    if not config.forecasting:
        return REACTIVE_STABILIZATION_S
    hold = hold_lead_times(config, seasonal) * lead
    if noise_floor_on(config):
        return max(hold, config.stable_window_s)  # a drop is in the signal only after one window
    return max(hold, REACTIVE_STABILIZATION_S)


def hold_lead_times(config: PolicyConfig, seasonal: bool = False) -> float:
    """How many lead times the scale-down window holds a replica: 1 + 1 / U (2 at U = 1); once the
    forecaster has its season (`seasonal`: the Autoscaler's forecaster is ready and knows one), one.

    Getting a replica back costs one lead time of its price while it starts, plus one lead time of
    demand it cannot serve. That demand is priced at what the user pays to serve demand safely: at a
    target utilization U, 1 / U replicas per replica of demand (the headroom 1 - U is the user's own
    price of the SLO). So the more headroom the user buys, the longer a replica is held; at U = 1
    (no headroom) it is the two lead times of plain ski rental. Measured on the frontier
    (docs/frontier-history.md, "A hold priced by the headroom"): at 99.9 % deepseek-r1 from 4.1-10.3 %
    above KEDA to 5.1-12.0 % below on the grid, m-mid at the measured cold starts 2.0 % -> 25.1 % below
    AIBrix; at 99 %, whose points sit at U 0.8-1.0, within 0.8 % of two lead times.

    Once the forecaster has learned the daily season, demand that comes back with the season is in the
    forecast term (the peak of the forecast over the next lead time), which orders it a lead time ahead:
    it is served on time, and getting a replica back for it costs only the start-up, one lead time. The
    second term was the price of a return nobody saw coming, and before the season that is every return.
    Measured (docs/frontier-history.md, "One lead time once the season is learned"): on the 14-day series
    cheaper at nearly every U and cold start (m-small 300 s at 99 % 6.0 -> 7.9 % below AIBrix, at 99.9 %
    15.9 -> 20.8 % below the fixed fleet), m-mid 30 s / measured at 99 % and m-small measured at 99.9 %
    turn from 0.0-0.2 % above AIBrix to below it; one-day and one-hour traces never have a season. What
    it costs: m-mid (a weak daily pattern) at 99.9 % and with the CPU warm pool at 300 s, where fewer of
    the returns are forecast than this assumes (25 -> 2 % and 24 -> 6 % below the best baseline)."""
    if seasonal:
        return 1.0
    return 1.0 + 1.0 / config.target_utilization


def noise_floor_on(config: PolicyConfig) -> bool:
    """Whether scale-downs are tested against the signal's noise: with the default forecasting window (a
    configured window is exactly that window, as in HPA), and the short trend's samples to measure it."""
    return (config.forecasting and config.scale_down_stabilization_s is None
            and config.scale_down_noise_sigmas > 0.0 and config.trend_window_s > 0.0)


def noise_floor(config: PolicyConfig, recent: Sequence[tuple[float, float]], needs: Needs, fc: Forecast,
                current: int, serving: int, reason: Reason, notes: list[str]) -> tuple[int, Reason]:
    """A scale-down goes no lower than what the demand plus `scale_down_noise_sigmas` standard deviations
    of the signal's noise needs (never above what serves now): a dip within the noise is held, a drop
    beyond it is given back.

    The noise is measured on the short trend's samples (the stable-window signal over the last
    `trend_window_s`), around their line. This is what HPA's 300 s floor under the window did on noisy
    traffic, without holding every real step down of smooth traffic for minutes. Measured on the
    frontier (99 %, U interpolated, against the best baseline; docs/frontier-history.md, "A noise floor
    instead of HPA's 300 s"): m-small 30 s 2.9 % -> 2.5 % above KPA, m-mid 30 s 0.7 % -> 1.7 % below
    AIBrix, mooncake 30 s 0.2 % -> 0.6 % below, deepseek-r1 30 s 1.6 % -> 1.4 % below (at 2 sigma it was
    0.9 % above: noise dips given back)."""
    if serving >= current or not noise_floor_on(config):
        return serving, reason
    sigma = noise_sigma(recent)
    if sigma <= 0.0:
        return serving, reason
    demand = max(needs.value, fc.value if fc.value is not None else 0.0)
    floor = min(current, replicas_needed(demand + config.scale_down_noise_sigmas * sigma, config))
    if floor <= serving:
        return serving, reason
    notes.append(f"signal {fmt(demand)} within {config.scale_down_noise_sigmas:g} sigma ({fmt(sigma)}) of "
                 f"what {floor} serve: no lower")
    return floor, Reason.STABILIZATION


def stabilize(
    config: PolicyConfig, serving_queue: TimeWindow, now: float, window: float, recommendation: int,
    reason: Reason, current: int, notes: list[str],
) -> tuple[int, Reason]:
    """Scale-down stabilization (HPA): the highest recommendation within the window wins; the
    scale-down rate bounds how far one decision may fall."""
    serving = recommendation
    stabilized = serving_queue.max(now, window) or 0
    if stabilized > serving:
        serving, reason = stabilized, Reason.STABILIZATION
        notes.append(f"highest recommendation in the last {window:g}s is {stabilized}")
    rate_floor = math.floor(current / config.max_scale_down_rate)
    if serving < rate_floor:
        serving, reason = rate_floor, Reason.STABILIZATION
        notes.append(f"max scale-down rate {config.max_scale_down_rate:g} allows no fewer than {rate_floor}")
    return serving, reason


def held_recommendation(config: PolicyConfig, needs: Needs, fc: Forecast, recommendation: int, in_panic: bool,
          pays: bool) -> int:
    """What the scale-down window remembers of this recommendation. Where a warm replica is cheaper,
    replicas promoted because requests queue now (the model server's gauges) are not held serving for
    the window: when the panic ends they go back to the warm pool (the total is stabilized), and the
    next queue promotes them again in seconds. What the rate signals and the forecast need is held."""
    if not (in_panic and pays and config.concurrency_per_replica is not None):
        return recommendation
    # The short window's rate is held only when it is a panic by itself (Knative's threshold); below it,
    # it is the noise the stable window averages, and held for the window it kept a 6 s peak serving
    # for minutes (mooncake, 300 s, 0.414, U 0.9: 14.4 h serving against 12.8 h without a pool).
    rate_panic = replicas_needed(needs.value_panic, config)
    if rate_panic < config.panic_threshold * needs.base:
        rate_panic = 0
    return min(recommendation, max(needs.reactive, fc.term, rate_panic))


def resume_after_gap(config: PolicyConfig, state: PolicyState, now: float) -> tuple[TimeWindow, TimeWindow]:
    """The stabilization queues, with a data gap taken out of their age.

    Missing data holds the fleet, and the first windows after a metrics outage are partial (a
    rate() over a window that is mostly gap, a logging pipeline catching up). If the gap aged the
    recommendations made before it, the first fresh sample would let the fleet drop at once to
    whatever that partial window shows, just before traffic that never went away is seen again.
    So the windows count observed time: entries made before the gap are shifted forward by the gap
    (beyond one decision interval), and a recovered pipeline has to show a full stabilization
    window of lower demand before the fleet shrinks.
    """
    last = state.last_data_s
    gap = now - last - config.decision_interval_s if last is not None and math.isfinite(last) else 0.0
    if not gap > 0.0:
        return state.serving_recommendations, state.total_recommendations
    return state.serving_recommendations.shifted(gap, now), state.total_recommendations.shifted(gap, now)
