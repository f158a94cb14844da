"""Scale to zero and the bounds: when an idle endpoint goes to zero serving replicas, and the
[floor, max_replicas] every decision is held within."""

from __future__ import annotations

from preheat.scaling.policy.signal import fmt
from preheat.scaling.policy.terms import Needs
from preheat.scaling.policy.types import PolicyConfig, PolicyState, Reason


def scale_to_zero(
    config: PolicyConfig, state: PolicyState, now: float, needs: Needs, fu: float | None, serving: int,
    in_panic: bool, notes: list[str],
) -> tuple[float | None, bool]:
    """(zero traffic since, scale to zero now): zero traffic for the grace period and no traffic
    forecast within the lead time.

    At zero pods the activator holds and counts the requests (controller/routing.py), so the signal
    stays fresh and the first request wakes the endpoint (a cold start later, as Knative's); a forecast
    above the idle fraction wakes it ahead of the traffic. Before the activator, the forecast was the
    only way back, and scale to zero waited for a forecaster with its season (0 % SLO without)."""
    if not (config.scale_to_zero and config.min_replicas == 0):
        return None, False
    zero_since = state.zero_since
    if needs.value == 0.0 and needs.value_panic == 0.0:
        zero_since = now if zero_since is None else zero_since
    else:
        zero_since = None
    idle = idle_forecast(config, fu)
    if zero_since is not None and now - zero_since >= config.scale_to_zero_grace_s and idle:
        return zero_since, not in_panic
    if serving == 0 and zero_since is not None:
        notes.append(
            f"zero traffic for {now - zero_since:.0f}s of a {config.scale_to_zero_grace_s:g}s grace"
            if idle
            else f"forecast upper {fmt(fu)} says traffic comes within the lead time"
        )
    return zero_since, False


def idle_forecast(config: PolicyConfig, fu: float | None) -> bool:
    """The upper forecast over the lead time is below `idle_forecast_fraction` of one replica's capacity.
    No forecast (forecasting off, or none yet) vetoes nothing: the activator's count wakes the endpoint,
    as Knative's does, and no forecast never asks for more than a forecast of anything."""
    if not config.forecasting or fu is None:
        return True
    return fu < config.idle_forecast_fraction * config.capacity_per_replica


def bound(config: PolicyConfig, serving: int, reason: Reason, to_zero: bool, notes: list[str]) -> tuple[int, Reason]:
    """Scale to zero, or hold serving within [floor, max_replicas]."""
    if to_zero:
        return 0, Reason.SCALE_TO_ZERO
    lo = config.floor_replicas
    if serving < lo and config.scale_to_zero and config.min_replicas == 0:
        # waiting out the grace (or the forecast): keep one replica, by stabilization not bounds
        serving, reason = lo, Reason.STABILIZATION
    clamped = min(max(serving, lo), config.max_replicas)
    if clamped != serving:
        notes.append(f"clamped to [{lo}, {config.max_replicas}]")
        serving, reason = clamped, Reason.BOUNDS
    return serving, reason
