"""What an observation's numbers are worth: a usable signal, the replicas it needs, the cold start to
plan for and the lead time it sets, and the replicas the requests present need."""

from __future__ import annotations

import math
from collections.abc import Sequence

from preheat.scaling.policy.types import Observation, PolicyConfig

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


def concurrency_need(config: PolicyConfig, obs: Observation) -> tuple[float, int]:
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


def sanitize_count(n: object) -> int:
    """A replica count as reported: a non-negative int; missing, NaN or negative counts are 0."""
    if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n):
        return 0
    return max(0, int(n))


def finite(x: object) -> bool:
    """A finite number (not a bool)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def fmt(x: float | None) -> str:
    """A value for a decision's detail text."""
    return "none" if x is None else f"{x:.4g}"
