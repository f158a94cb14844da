"""Upper-quantile forecasts from the forecaster's own recent errors at each horizon.

Answers "how high could the signal plausibly be at now + h" so pre-scaling has an explicit, tunable
safety margin: the policy sizes the warm pool from the gap between this and the point forecast.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from preheat.scaling.forecast.base import (
    Forecaster,
    check_quantile,
    clean_sample,
    sample_quantile,
    valid_query,
)
from preheat.scaling.forecast.restore import forecaster_from_dict, restorable

# Forecasts are issued for scoring at most this often per horizon: with 15 s samples, scoring
# every one would double the cost of a step for little more information.
MIN_ISSUE_S = 30.0

DEFAULT_HORIZONS_S = (60.0, 300.0, 900.0, 3600.0)


def snap_horizon(h: float) -> float:
    """Round a horizon onto a grid of 15 s x sqrt(2)^k, so lead times that drift with measured cold
    starts reuse a few tracked horizons instead of adding a new one each time."""
    k = round(2.0 * math.log2(max(h, 1.0) / 15.0))
    return round(15.0 * 2.0 ** (k / 2.0), 3)


@restorable
class QuantileForecaster:
    """Wraps a point forecaster and learns the distribution of its relative errors per horizon.

    At each sample it issues the base model's forecast for every tracked horizon (at most 8 in
    flight per horizon); when the target time arrives it stores the relative error
    (actual - forecast) / max(forecast, floor) in a ring of the last `window` errors. The upper
    forecast is point + q-quantile(error) x max(point, floor). Relative errors keep the margin
    proportional to traffic (the daily peak gets a bigger margin than the night). `floor` is 10 % of
    the signal's running mean, so near-zero forecasts do not blow ratios up. Horizons are tracked
    when first asked for (snapped to a sqrt(2) grid, up to `max_horizons`), since tracking costs a
    forecast per sample; `horizons_s` pre-tracks some. Until a horizon has `min_residuals` errors the
    margin comes from neighbouring horizons, else from the base model's own estimate.
    """

    kind = "quantile"

    def __init__(
        self,
        base: Forecaster,
        horizons_s: tuple[float, ...] | list[float] = (),
        window: int = 288,
        min_residuals: int = 12,
        max_horizons: int = 10,
    ) -> None:
        if window < 1 or min_residuals < 1 or max_horizons < 1:
            raise ValueError("window, min_residuals and max_horizons must be positive")
        self.base = base
        self.window = int(window)
        self.min_residuals = int(min_residuals)
        self.max_horizons = int(max_horizons)
        self._horizons: dict[float, _Track] = {}
        for h in horizons_s:
            self._track(float(h))
        self.level = 0.0  # running mean of the signal, for the relative-error floor
        self.dt_typ = 0.0
        self.t_last: float | None = None
        self.n = 0

    # -- protocol --------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return bool(self.base.ready)

    @property
    def seasonal(self) -> bool:
        return bool(getattr(self.base, "seasonal", False))

    @property
    def horizons_s(self) -> list[float]:
        return sorted(self._horizons)

    def update(self, t_s: float, value: float | None) -> None:
        self.base.update(t_s, value)
        sample = clean_sample(t_s, value)
        if sample is None or sample[1] is None:
            return
        t, y = sample
        if self.t_last is not None:
            if t < self.t_last:
                return
            dt = t - self.t_last
            if dt > 0:
                self.dt_typ = dt if self.dt_typ == 0 else self.dt_typ + 0.1 * (dt - self.dt_typ)
        self.level = y if self.n == 0 else self.level + 0.02 * (y - self.level)
        self.t_last = t
        self.n += 1
        floor = self._floor()
        # An observation answers a pending forecast if it is the first one at or after the target
        # and not more than one sample spacing late (after a gap the forecast is dropped unanswered).
        late_ok = max(self.dt_typ, 1.0) * 1.01
        for h, track in self._horizons.items():
            pending = track.pending
            while pending and pending[0][0] <= t + 1e-6:
                target, point = pending.popleft()
                if t - target <= late_ok:
                    track.residuals.append((y - point) / max(point, floor))
                    track.cache.clear()
            if track.last_issue is None or t - track.last_issue >= max(h / 8.0, MIN_ISSUE_S):
                point = self.base.forecast(t, h)
                if point is not None:
                    pending.append((t + h, point))
                    track.last_issue = t

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        return self.base.forecast(t_s, horizon_s)

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        q = check_quantile(quantile)
        point = self.base.forecast(t_s, horizon_s)
        if point is None or not valid_query(t_s, horizon_s):
            return None
        rel = self.relative_margin(horizon_s, q)
        if rel is None:
            fallback = self.base.forecast_upper(t_s, horizon_s, q)
            return max(point, fallback if fallback is not None else point)
        return point + max(0.0, rel) * max(point, self._floor())

    # -- margins ---------------------------------------------------------------------------------
    def relative_margin(self, horizon_s: float, quantile: float) -> float | None:
        """q-quantile of relative errors at this horizon (interpolated between tracked ones), or None."""
        h = float(horizon_s)
        if h not in self._horizons and len(self._horizons) < self.max_horizons and h > 0:
            nearest = min(self._horizons, key=lambda k: abs(math.log(k / h)), default=None)
            if nearest is None or abs(math.log(nearest / h)) > math.log(1.25):
                self._track(snap_horizon(h))
        usable = {k: v for k, v in self._horizons.items() if len(v.residuals) >= self.min_residuals}
        if not usable:
            return None
        below = [k for k in usable if k <= h]
        above = [k for k in usable if k >= h]
        if below and above:
            lo, hi = max(below), min(above)
            m_lo = usable[lo].quantile(quantile)
            if hi == lo:
                return m_lo
            m_hi = usable[hi].quantile(quantile)
            w = (h - lo) / (hi - lo)
            return m_lo + w * (m_hi - m_lo)
        if above:  # shorter than anything measured: the shortest measured margin is a safe bound
            return usable[min(above)].quantile(quantile)
        # longer than anything measured: grow like a random walk from the longest one
        longest = max(below)
        return usable[longest].quantile(quantile) * math.sqrt(h / longest)

    def _floor(self) -> float:
        return max(0.1 * self.level, 1e-9)

    def _track(self, h: float) -> None:
        if h > 0 and h not in self._horizons:
            self._horizons[h] = _Track(deque(), deque(maxlen=self.window), None)

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "params": {"window": self.window, "min_residuals": self.min_residuals,
                       "max_horizons": self.max_horizons},
            "state": {
                "level": self.level,
                "dt_typ": self.dt_typ,
                "t_last": self.t_last,
                "n": self.n,
                "horizons": [
                    {"h": h, "pending": [list(p) for p in tr.pending], "residuals": list(tr.residuals),
                     "last_issue": tr.last_issue}
                    for h, tr in sorted(self._horizons.items())
                ],
            },
            "base": self.base.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantileForecaster:
        f = cls(forecaster_from_dict(d["base"]), horizons_s=(), **d["params"])
        s = d["state"]
        f.level, f.dt_typ, f.t_last, f.n = s["level"], s["dt_typ"], s["t_last"], s["n"]
        for item in s["horizons"]:
            track = _Track(
                deque((float(a), float(b)) for a, b in item["pending"]),
                deque((float(r) for r in item["residuals"]), maxlen=f.window),
                item["last_issue"],
            )
            f._horizons[float(item["h"])] = track
        return f


class _Track:
    """Per-horizon bookkeeping: forecasts awaiting their target time and the recent errors."""

    __slots__ = ("cache", "last_issue", "pending", "residuals")

    def __init__(self, pending: deque, residuals: deque, last_issue: float | None) -> None:
        self.pending: deque[tuple[float, float]] = pending
        self.residuals: deque[float] = residuals
        self.last_issue = last_issue
        # quantile -> value, cleared on each new residual (the policy asks several times per step)
        self.cache: dict[float, float] = {}

    def quantile(self, q: float) -> float:
        value = self.cache.get(q)
        if value is None:
            value = self.cache[q] = sample_quantile(list(self.residuals), q)
        return value
