"""Seasonal forecaster: additive Holt-Winters in continuous time, daily season, optionally weekly.

Answers "what will the signal be in an hour, given yesterday's shape". Works on any sample spacing
(the operator's 15-60 s samples or ServeGen's 10-minute windows): the seasonal profile lives on a
fixed grid of knots (a bucket size, e.g. 288 per day) with linear interpolation between them, and
smoothing weights come from time constants, not per-sample constants. Until one season of history
exists it answers with its built-in TrendForecaster (graceful fallback).
"""

from __future__ import annotations

import math
from typing import Any

from preheat.scaling.forecast.base import clean_sample, damped_sum, gain, valid_query, z_score
from preheat.scaling.forecast.restore import restorable
from preheat.scaling.forecast.trend import TrendForecaster

DAY_S = 86400.0
WEEK_S = 7 * DAY_S


class SeasonProfile:
    """A periodic additive profile on `knots` evenly spaced knots, linearly interpolated.

    Knot k sits at phase k x bucket; a sample at an exact bucket boundary touches one knot only, so
    window-aligned series (ServeGen) map one window to one knot.
    """

    def __init__(self, period_s: float, knots: int, values: list[float] | None = None) -> None:
        if knots < 1 or not period_s > 0:
            raise ValueError(f"season needs a positive period and at least one knot, got {period_s!r}, {knots!r}")
        self.period_s = float(period_s)
        self.knots = int(knots)
        self.values = list(values) if values is not None else [0.0] * self.knots
        if len(self.values) != self.knots:
            raise ValueError(f"season has {len(self.values)} values for {self.knots} knots")

    @property
    def bucket_s(self) -> float:
        return self.period_s / self.knots

    def position(self, t_s: float) -> tuple[int, int, float]:
        phase = (t_s % self.period_s) / self.bucket_s
        base = math.floor(phase)
        frac = phase - base
        if frac < 1e-9:  # float noise at exact boundaries
            frac = 0.0
        i = int(base) % self.knots
        return i, (i + 1) % self.knots, frac

    def value(self, t_s: float) -> float:
        i, j, f = self.position(t_s)
        return (1.0 - f) * self.values[i] + f * self.values[j]

    def nudge(self, t_s: float, delta: float) -> None:
        i, j, f = self.position(t_s)
        self.values[i] += (1.0 - f) * delta
        if f > 0.0:
            self.values[j] += f * delta

    def centre(self) -> float:
        """Make the profile mean-zero; returns the mean removed (the caller adds it to the level)."""
        mean = sum(self.values) / self.knots
        self.values = [v - mean for v in self.values]
        return mean


def _fill_circular(values: list[float | None]) -> list[float]:
    """Fill knots never observed by linear interpolation between the nearest observed ones (circular)."""
    n = len(values)
    known = [i for i, v in enumerate(values) if v is not None]
    if not known:
        return [0.0] * n
    out = [0.0] * n
    for idx, k in enumerate(known):
        nxt = known[(idx + 1) % len(known)]
        span = (nxt - k) % n or n
        vk, vn = values[k], values[nxt]
        assert vk is not None and vn is not None
        for step in range(span):
            out[(k + step) % n] = vk + (vn - vk) * step / span
    return out


@restorable
class HoltWinters:
    """Additive Holt-Winters with a damped trend, updated one sample at a time.

    knots: points of the daily profile (48 = every 30 minutes, linearly interpolated). A smooth
    profile forecasts better than a detailed one, whose knot-to-knot noise adds straight to the
    forecast (ServeGen benchmark: 96 and 144 knots clearly worse; 24 marginally better than 48),
    but too smooth a profile smears a sharp morning ramp and pre-scales late; 48 keeps a 30-minute
    ramp sharp enough to ask for capacity a cold start ahead (tests/brain/test_autoscaler.py);
    level_tau_s: time constant of the deseasonalised level; trend_tau_s: time constant of its slope,
    None (the default) for no trend: on the benchmark series a trend term added error, and the
    ensemble's trend member covers ramps; damping_s: trend damping; gamma: how much of a
    season's profile one new season rewrites (per visit of a knot, whatever the sample spacing);
    clip: seasonal updates use residuals clipped to `clip` error scales, so one outage or spike does
    not scar the profile for days; reset_gap_s: after a gap this long the level restarts from the
    next sample (the profile is kept).
    """

    kind = "holt-winters"

    def __init__(
        self,
        season_s: float = DAY_S,
        knots: int = 48,
        weekly: bool = False,
        weekly_knots: int = 168,
        level_tau_s: float = 300.0,
        trend_tau_s: float | None = None,
        damping_s: float = 1800.0,
        gamma: float = 0.3,
        gamma_weekly: float = 0.3,
        clip: float = 4.0,
        reset_gap_s: float = 6 * 3600.0,
        fallback: TrendForecaster | None = None,
    ) -> None:
        if not 0.0 < gamma <= 1.0 or not 0.0 < gamma_weekly <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r} / {gamma_weekly!r}")
        for name, v in (("level_tau_s", level_tau_s), ("trend_tau_s", trend_tau_s or 0.0),
                        ("damping_s", damping_s), ("clip", clip), ("reset_gap_s", reset_gap_s)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        self.daily = SeasonProfile(season_s, knots)
        self.weekly = SeasonProfile(WEEK_S, weekly_knots) if weekly else None
        self.level_tau_s = float(level_tau_s)
        self.trend_tau_s = None if trend_tau_s is None else float(trend_tau_s)
        self.damping_s = float(damping_s)
        self.gamma = float(gamma)
        self.gamma_weekly = float(gamma_weekly)
        self.clip = float(clip)
        self.reset_gap_s = float(reset_gap_s)
        self.fallback = fallback or TrendForecaster()
        # first-season accumulation (hat-weighted sums per knot)
        self._init_sum = [0.0] * knots
        self._init_w = [0.0] * knots
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.seasonal_ready = False
        self.weekly_since: float | None = None
        self.level = 0.0
        self.slope = 0.0
        self.abs_err = 0.0
        self.dt_typ = 0.0
        self.n = 0
        self._last_knot = -1

    # -- state ---------------------------------------------------------------------------------
    seasonal = True  # its full model (`ready`) knows the daily season

    @property
    def ready(self) -> bool:
        if not self.seasonal_ready:
            return False
        if self.weekly is None:
            return True
        return self.weekly_since is not None and self.t_last is not None and self.t_last - self.weekly_since >= WEEK_S

    def _season(self, t_s: float) -> float:
        s = self.daily.value(t_s)
        if self.weekly is not None and self.weekly_since is not None:
            s += self.weekly.value(t_s)
        return s

    def update(self, t_s: float, value: float | None) -> None:
        sample = clean_sample(t_s, value)
        if sample is None or sample[1] is None:
            return
        t, y = sample
        self.fallback.update(t, y)
        if self.t_first is None:
            self.t_first = t
        if self.t_last is not None and t < self.t_last:
            return  # out of order
        if not self.seasonal_ready:
            self._accumulate_first_season(t, y)
            return
        assert self.t_last is not None
        dt = t - self.t_last
        season_now = self._season(t)
        if dt > self.reset_gap_s:
            self.level, self.slope, self.t_last = y - season_now, 0.0, t
            return
        predicted_level = self.level + self.slope * damped_sum(dt, self.damping_s)
        err = y - (predicted_level + season_now)
        new_level = predicted_level + gain(dt, self.level_tau_s) * (y - season_now - predicted_level)
        if dt > 0:
            if self.trend_tau_s is not None:
                self.slope += gain(dt, self.trend_tau_s) * ((new_level - self.level) / dt - self.slope)
            self.dt_typ = dt if self.dt_typ == 0 else self.dt_typ + 0.1 * (dt - self.dt_typ)
        # Seasonal residual, clipped at a robust multiple of the usual error.
        resid = y - new_level - season_now
        if self.abs_err > 0 and self.clip > 0:
            bound = self.clip * 1.25 * self.abs_err
            resid = min(max(resid, -bound), bound)
        self.abs_err = abs(err) if self.n == 0 else self.abs_err + 0.05 * (abs(err) - self.abs_err)
        visits = max(dt, 1e-9) / self.daily.bucket_s
        self.daily.nudge(t, (1.0 - (1.0 - self.gamma) ** min(visits, 1.0)) * resid)
        if self.weekly is not None:
            if self.weekly_since is None:
                self.weekly_since = t
            visits_w = max(dt, 1e-9) / self.weekly.bucket_s
            self.weekly.nudge(t, (1.0 - (1.0 - self.gamma_weekly) ** min(visits_w, 1.0)) * resid * 0.5)
        self.level, self.t_last = new_level, t
        self.n += 1
        knot = self.daily.position(t)[0]
        if knot < self._last_knot:  # wrapped into a new season: keep the profile mean-zero
            self.level += self.daily.centre()
            if self.weekly is not None:
                self.level += self.weekly.centre()
        self._last_knot = knot

    def _accumulate_first_season(self, t: float, y: float) -> None:
        i, j, f = self.daily.position(t)
        self._init_sum[i] += (1.0 - f) * y
        self._init_w[i] += 1.0 - f
        if f > 0.0:
            self._init_sum[j] += f * y
            self._init_w[j] += f
        self.t_last = t
        assert self.t_first is not None
        covered = sum(1 for w in self._init_w if w > 0) / self.daily.knots
        if t - self.t_first >= self.daily.period_s - self.daily.bucket_s and covered >= 0.5:
            means = [s / w if w > 0 else None for s, w in zip(self._init_sum, self._init_w, strict=True)]
            self.daily.values = _fill_circular(means)
            self.daily.centre()
            base = self.fallback.level if self.fallback.level is not None else y
            self.level = base - self.daily.value(t)
            self.slope = 0.0
            self.seasonal_ready = True
            self._last_knot = i
            self._init_sum = [0.0] * self.daily.knots
            self._init_w = [0.0] * self.daily.knots
            self.abs_err = self.fallback.abs_err

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        if not valid_query(t_s, horizon_s):
            return None
        if not self.seasonal_ready or self.t_last is None:
            return self.fallback.forecast(t_s, horizon_s)
        target = t_s + horizon_s
        ahead = max(0.0, target - self.t_last)
        return max(0.0, self.level + self.slope * damped_sum(ahead, self.damping_s) + self._season(target))

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        """Point + z(q) x the usual one-sample error, growing slowly (fourth root) with the horizon.

        The seasonal profile carries most of the shape, so errors grow far more slowly than a random
        walk's; QuantileForecaster replaces this with measured residual quantiles.
        """
        if not self.seasonal_ready:
            return self.fallback.forecast_upper(t_s, horizon_s, quantile)
        point = self.forecast(t_s, horizon_s)
        if point is None:
            return None
        steps = max(1.0, horizon_s / self.dt_typ) if self.dt_typ > 0 else 1.0
        return point + max(0.0, z_score(quantile)) * 1.25 * self.abs_err * steps**0.25

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "params": {
                "season_s": self.daily.period_s,
                "knots": self.daily.knots,
                "weekly": self.weekly is not None,
                "weekly_knots": self.weekly.knots if self.weekly is not None else 168,
                "level_tau_s": self.level_tau_s,
                "trend_tau_s": self.trend_tau_s,
                "damping_s": self.damping_s,
                "gamma": self.gamma,
                "gamma_weekly": self.gamma_weekly,
                "clip": self.clip,
                "reset_gap_s": self.reset_gap_s,
            },
            "state": {
                "daily": self.daily.values,
                "weekly": self.weekly.values if self.weekly is not None else None,
                "init_sum": self._init_sum,
                "init_w": self._init_w,
                "t_first": self.t_first,
                "t_last": self.t_last,
                "seasonal_ready": self.seasonal_ready,
                "weekly_since": self.weekly_since,
                "level": self.level,
                "slope": self.slope,
                "abs_err": self.abs_err,
                "dt_typ": self.dt_typ,
                "n": self.n,
                "last_knot": self._last_knot,
            },
            "fallback": self.fallback.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HoltWinters:
        f = cls(**d["params"], fallback=TrendForecaster.from_dict(d["fallback"]))
        s = d["state"]
        f.daily.values = [float(v) for v in s["daily"]]
        if f.weekly is not None and s.get("weekly") is not None:
            f.weekly.values = [float(v) for v in s["weekly"]]
        f._init_sum = [float(v) for v in s["init_sum"]]
        f._init_w = [float(v) for v in s["init_w"]]
        f._last_knot = int(s["last_knot"])
        for k in ("t_first", "t_last", "seasonal_ready", "weekly_since", "level", "slope", "abs_err",
                  "dt_typ", "n"):
            setattr(f, k, s[k])
        return f
