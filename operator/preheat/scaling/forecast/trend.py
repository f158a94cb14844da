"""Short-horizon trend forecaster: continuous-time damped Holt (level + damped trend).

Answers "where is the signal heading over the next minutes" from the last samples alone; it is also
the fallback of the seasonal model while history is shorter than one season.
"""

from __future__ import annotations

import math
from typing import Any

from preheat.scaling.forecast.base import clean_sample, damped_sum, gain, valid_query, z_score
from preheat.scaling.forecast.restore import restorable


@restorable
class TrendForecaster:
    """Damped Holt in continuous time, O(1) per sample.

    level_tau_s: time constant of the level (how fast it follows the signal);
    trend_tau_s: time constant of the slope estimate; damping_s: the trend is extrapolated with
    exponential damping, so forecasts far ahead stop at level + slope x damping_s;
    reset_gap_s: after a gap this long the old slope is meaningless and is dropped.
    Defaults: a 30 s level (the operator's samples are already 60 s rates), a slope averaged over
    about an hour and damped within 5 minutes: a slope from noisy samples extrapolated far ahead
    costs more than it gains (benchmark: faster slopes lost to persistence on every series).
    """

    kind = "trend"

    def __init__(
        self,
        level_tau_s: float = 30.0,
        trend_tau_s: float = 3600.0,
        damping_s: float = 300.0,
        reset_gap_s: float = 3600.0,
    ) -> None:
        for name, v in (("level_tau_s", level_tau_s), ("trend_tau_s", trend_tau_s), ("damping_s", damping_s),
                        ("reset_gap_s", reset_gap_s)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        self.level_tau_s = float(level_tau_s)
        self.trend_tau_s = float(trend_tau_s)
        self.damping_s = float(damping_s)
        self.reset_gap_s = float(reset_gap_s)
        self.level: float | None = None
        self.slope = 0.0  # signal units per second
        self.t_last: float | None = None
        self.n = 0
        # EW mean absolute one-sample-ahead error and typical sample spacing, for forecast_upper.
        self.abs_err = 0.0
        self.dt_typ = 0.0

    # -- state ---------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.n >= 3

    def update(self, t_s: float, value: float | None) -> None:
        sample = clean_sample(t_s, value)
        if sample is None or sample[1] is None:
            return
        t, y = sample
        if self.level is None or self.t_last is None:
            self.level, self.t_last, self.n = y, t, 1
            return
        dt = t - self.t_last
        if dt < 0:
            return  # out of order: the state already reflects a later time
        if dt > self.reset_gap_s:
            self.level, self.slope, self.t_last = y, 0.0, t
            self.n += 1
            return
        predicted = max(0.0, self.level + self.slope * damped_sum(dt, self.damping_s))
        err = y - predicted
        a = gain(dt, self.level_tau_s) if dt > 0 else 0.5
        new_level = predicted + a * err
        if dt > 0:
            b = gain(dt, self.trend_tau_s)
            self.slope += b * ((new_level - self.level) / dt - self.slope)
            self.dt_typ = dt if self.dt_typ == 0 else self.dt_typ + 0.1 * (dt - self.dt_typ)
        self.abs_err = abs(err) if self.n == 1 else self.abs_err + 0.05 * (abs(err) - self.abs_err)
        self.level, self.t_last = new_level, max(self.t_last, t)
        self.n += 1

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        if self.level is None or self.t_last is None or not valid_query(t_s, horizon_s):
            return None
        ahead = max(0.0, t_s + horizon_s - self.t_last)
        return max(0.0, self.level + self.slope * damped_sum(ahead, self.damping_s))

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        """Point + z(q) x one-sample error scale x sqrt(samples ahead): a Gaussian random-walk margin."""
        point = self.forecast(t_s, horizon_s)
        if point is None:
            return None
        steps = max(1.0, horizon_s / self.dt_typ) if self.dt_typ > 0 else 1.0
        sigma = 1.25 * self.abs_err  # mean absolute error -> standard deviation for a normal
        return point + max(0.0, z_score(quantile)) * sigma * math.sqrt(steps)

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "params": {
                "level_tau_s": self.level_tau_s,
                "trend_tau_s": self.trend_tau_s,
                "damping_s": self.damping_s,
                "reset_gap_s": self.reset_gap_s,
            },
            "state": {
                "level": self.level,
                "slope": self.slope,
                "t_last": self.t_last,
                "n": self.n,
                "abs_err": self.abs_err,
                "dt_typ": self.dt_typ,
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrendForecaster:
        f = cls(**d["params"])
        for k, v in d["state"].items():
            setattr(f, k, v)
        return f
