"""The forecaster protocol and the helpers every online forecaster shares.

A forecaster answers one question: what will the scaling signal be at now + h? It is fed one sample
at a time (`update`), keeps O(1)-ish state that serialises to JSON (the operator persists it across
restarts), and never raises on bad samples: None, NaN, inf and negative values are missing data.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Forecaster(Protocol):
    """What the policy and the simulator need from a forecaster."""

    def update(self, t_s: float, value: float | None) -> None:
        """Feed the signal at time t_s (seconds). None, NaN or negative values mark a gap."""
        ...

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        """Point forecast of the signal at t_s + horizon_s; None while there is no basis at all."""
        ...

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        """Upper-quantile forecast at t_s + horizon_s (>= the point forecast): the safety margin."""
        ...

    @property
    def ready(self) -> bool:
        """True once the forecaster has the history its full model needs (e.g. one season)."""
        ...

    # Optional: `seasonal` (bool), True where a `ready` model knows the load's season (Holt-Winters,
    # seasonal naive, an ensemble led by one); the Autoscaler reads it with getattr, default False.

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state, including a `kind` tag for `forecaster_from_dict`."""
        ...


def clean_sample(t_s: object, value: object) -> tuple[float, float | None] | None:
    """Normalise one sample: (t, value) with value None when missing; None when t itself is unusable."""
    if isinstance(t_s, bool) or not isinstance(t_s, int | float) or not math.isfinite(t_s):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return float(t_s), None
    v = float(value)
    if not math.isfinite(v) or v < 0.0:
        # Negative rates come from counter resets seen through a naive delta: not a real signal.
        return float(t_s), None
    return float(t_s), v


def valid_query(t_s: object, horizon_s: object) -> bool:
    """A forecast question that can be answered: finite time, finite non-negative horizon."""
    try:
        return math.isfinite(t_s) and math.isfinite(horizon_s) and horizon_s >= 0  # type: ignore[arg-type,operator]
    except TypeError:
        return False


def gain(dt_s: float, tau_s: float) -> float:
    """Smoothing weight for a sample dt_s after the last one, with time constant tau_s.

    Exponential smoothing in continuous time: the same tau gives the same behaviour whether samples
    come every 15 s or every 10 minutes, and a long gap lets the new sample count for more.
    """
    if tau_s <= 0.0:
        return 1.0
    return 1.0 - math.exp(-max(dt_s, 0.0) / tau_s)


def damped_sum(elapsed_s: float, damping_s: float) -> float:
    """Seconds of trend to add at elapsed_s ahead with exponential damping (tends to damping_s)."""
    if elapsed_s <= 0.0:
        return 0.0
    if damping_s <= 0.0:
        return elapsed_s
    return damping_s * (1.0 - math.exp(-elapsed_s / damping_s))


def z_score(quantile: float) -> float:
    """Standard normal quantile, clamped to a sane range for 0 < q < 1."""
    q = min(max(quantile, 1e-4), 1 - 1e-4)
    return NormalDist().inv_cdf(q)


def check_quantile(quantile: object) -> float:
    if isinstance(quantile, bool) or not isinstance(quantile, int | float) or not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be strictly between 0 and 1, got {quantile!r}")
    return float(quantile)


def sample_quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) of a non-empty list."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
