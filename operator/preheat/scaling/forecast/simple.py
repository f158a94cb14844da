"""Reference forecasters: persistence and seasonal naive.

They answer the same question as the real models with the simplest possible rule, so the benchmark
can say how much the real models add; they are also valid (if crude) choices for `make_forecaster`.
"""

from __future__ import annotations

import math
from typing import Any

from preheat.scaling.forecast.base import clean_sample, valid_query, z_score
from preheat.scaling.forecast.holt_winters import DAY_S, SeasonProfile
from preheat.scaling.forecast.restore import restorable


@restorable
class Persistence:
    """Forecast = the last observed value, whatever the horizon."""

    kind = "persistence"

    def __init__(self) -> None:
        self.last: float | None = None
        self.t_last: float | None = None
        self.abs_err = 0.0
        self.n = 0

    @property
    def ready(self) -> bool:
        return self.last is not None

    def update(self, t_s: float, value: float | None) -> None:
        sample = clean_sample(t_s, value)
        if sample is None or sample[1] is None:
            return
        t, y = sample
        if self.t_last is not None and t < self.t_last:
            return
        if self.last is not None:
            self.abs_err = abs(y - self.last) if self.n == 1 else self.abs_err + 0.05 * (abs(y - self.last) - self.abs_err)
        self.last, self.t_last = y, t
        self.n += 1

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        return self.last if valid_query(t_s, horizon_s) else None

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        point = self.forecast(t_s, horizon_s)
        if point is None:
            return None
        return point + max(0.0, z_score(quantile)) * 1.25 * self.abs_err

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": {},
                "state": {"last": self.last, "t_last": self.t_last, "abs_err": self.abs_err, "n": self.n}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Persistence:
        f = cls()
        for k, v in d["state"].items():
            setattr(f, k, v)
        return f


@restorable
class SeasonalNaive:
    """Forecast = the value seen one season before the target time (persistence until then).

    Values are kept per knot of a SeasonProfile (the last sample that fell on each knot), so memory
    is bounded by the knot count, not by the sample rate.
    """

    kind = "seasonal-naive"

    def __init__(self, season_s: float = DAY_S, knots: int = 288) -> None:
        self.profile = SeasonProfile(season_s, knots, [math.nan] * knots)
        self.seen_at: list[float | None] = [None] * knots
        self.persistence = Persistence()

    seasonal = True  # ready once it has seen a whole season

    @property
    def ready(self) -> bool:
        t = self.persistence.t_last
        first = min((s for s in self.seen_at if s is not None), default=None)
        return t is not None and first is not None and t - first >= self.profile.period_s - self.profile.bucket_s

    def update(self, t_s: float, value: float | None) -> None:
        sample = clean_sample(t_s, value)
        if sample is None or sample[1] is None:
            return
        t, y = sample
        self.persistence.update(t, y)
        i, _, f = self.profile.position(t)
        k = i if f < 0.5 else (i + 1) % self.profile.knots
        self.profile.values[k] = y
        self.seen_at[k] = t

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        if not valid_query(t_s, horizon_s):
            return None
        target = t_s + horizon_s
        i, _, f = self.profile.position(target)
        k = i if f < 0.5 else (i + 1) % self.profile.knots
        seen = self.seen_at[k]
        # Only a value from the last season counts; an older one would be two seasons stale.
        if seen is not None and target - seen <= self.profile.period_s + self.profile.bucket_s:
            return self.profile.values[k]
        return self.persistence.forecast(t_s, horizon_s)

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        point = self.forecast(t_s, horizon_s)
        if point is None:
            return None
        return point + max(0.0, z_score(quantile)) * 1.25 * self.persistence.abs_err

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "params": {"season_s": self.profile.period_s, "knots": self.profile.knots},
            "state": {
                "values": [None if math.isnan(v) else v for v in self.profile.values],
                "seen_at": self.seen_at,
                "persistence": self.persistence.to_dict(),
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeasonalNaive:
        f = cls(**d["params"])
        s = d["state"]
        f.profile.values = [math.nan if v is None else float(v) for v in s["values"]]
        f.seen_at = list(s["seen_at"])
        f.persistence = Persistence.from_dict(s["persistence"])
        return f
