"""The warm pool: loaded replicas outside the Service, sized by the forecast's margin where a warm replica
pays, and the burst envelope that keeps loaded capacity on bursty traffic."""

from __future__ import annotations

from preheat.scaling.policy.terms import Needs
from preheat.scaling.policy.types import PolicyConfig, Reason
from preheat.scaling.policy.window import TimeWindow


def warm_pool(
    config: PolicyConfig,
    total_recs: TimeWindow,
    now: float,
    serving: int,
    upper_need: int,
    window: float,
    pays: bool,
    held: int,
    recommended: int,
) -> tuple[int, TimeWindow]:
    """Warm pool = configured minimum + the forecast's burst margin (upper need beyond serving).

    The margin is kept only where a warm replica costs less than it is worth (`warm_pays`: the cold
    start's share of the lead time, `PolicyConfig.warm_value`); elsewhere the pool is the configured
    minimum, as at a warm cost of 1. Replicas the queue promoted beyond what the rate signals and the
    forecast hold (`held`) are the margin's, on loan: the pool is not refilled for them with cold
    starts, and where a warm replica pays the total (serving + warm) is stabilized over the window so
    that they go back to the pool when the queue is gone. The total is counted on `recommended` (the
    serving recommendation before the scale-down window, the queue's included), not on the stabilized
    serving: a replica freed from serving has been held there for the window already, which is ski
    rental's whole rent for one re-buy (`scale_down.hold_lead_times`), so it is deleted then, not held a
    second window warm (measured: that second window cost 0.5-2 % more replica-hours for the same SLO on
    deepseek-r1, m-small and m-mid at 300 s, docs/frontier-history.md). Capped by warm_pool_max and by
    max_replicas - serving (max_replicas bounds the Deployment).
    """
    if serving == 0:
        return 0, total_recs.record(now, 0, window)
    base = min(held, serving) if pays else serving
    extra = max(0, upper_need - base) if pays else 0
    warm_rec = min(config.warm_pool_min + extra, config.warm_pool_max)
    # Replicas the queue promoted (serving - base) are the margin's, on loan: the pool is not refilled
    # with cold starts for them; they come back to it when the queue is gone.
    warm_rec = max(min(config.warm_pool_min, config.warm_pool_max), warm_rec - (serving - base))
    total_rec = min(serving, recommended) + warm_rec
    total_queue = total_recs.record(now, total_rec, window)
    if not pays:
        return max(0, min(warm_rec, config.max_replicas - serving)), total_queue
    stabilized_total = total_queue.max(now, window) or total_rec
    warm = max(warm_rec, min(stabilized_total - serving, config.warm_pool_max))
    warm = max(0, min(warm, config.max_replicas - serving))
    return warm, total_queue


def burst_envelope(
    config: PolicyConfig, burst_needs: TimeWindow, now: float, needs: Needs, current: int
) -> tuple[TimeWindow, int]:
    """(the burst window, the highest short-window need in it). A step counts as a burst when the
    short-window need is burst_threshold x the stable one, or requests wait with every slot busy."""
    if config.burst_memory_s <= 0.0:
        return burst_needs, 0
    bursty = needs.panic >= config.burst_threshold * max(needs.reactive, 1) or (
        needs.waiting > 0 and needs.present > current)
    span = config.burst_memory_s
    window = burst_needs.record(now, needs.panic, span) if bursty else burst_needs.within(now, span)
    return window, window.max(now, span) or 0


def apply_burst(
    config: PolicyConfig, serving: int, warm: int, burst_need: int, reason: Reason, prev_serving: int,
    prev_warm: int, notes: list[str],
) -> tuple[int, Reason]:
    """Burst envelope: on bursty traffic keep serving + warm at the highest short-window need of the
    last burst_memory_s (the warm pool is promoted in seconds when the next burst queues)."""
    burst_warm = 0
    if serving > 0 and burst_need > serving:
        burst_warm = max(0, min(burst_need - serving, config.warm_pool_max, config.max_replicas - serving))
    by_burst = burst_warm > warm
    if by_burst:
        warm = burst_warm
        notes.append(f"burst envelope: short-window need {burst_need} within the last {config.burst_memory_s:g}s")
    steady = reason in (Reason.REACTIVE, Reason.FORECAST, Reason.STABILIZATION) and serving == prev_serving
    if steady and by_burst:
        reason = Reason.BURST  # serving holds; the burst envelope sets the Deployment's total
    elif steady and warm != prev_warm:
        reason = Reason.WARM_POOL
    return warm, reason
