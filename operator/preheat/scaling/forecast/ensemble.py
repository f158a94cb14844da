"""Forecast combination: weight several online forecasters by their recent error at each horizon.

Answers "which model to believe for this endpoint, at this horizon" without a human choosing: a
strongly daily endpoint ends up trusting the seasonal model an hour ahead, a noisy one with a weak
daily pattern leans on the level. This is the `auto` forecaster.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from preheat.scaling.forecast.base import Forecaster, clean_sample, valid_query
from preheat.scaling.forecast.quantile import DEFAULT_HORIZONS_S, MIN_ISSUE_S
from preheat.scaling.forecast.restore import forecaster_from_dict, restorable


@restorable
class EnsembleForecaster:
    """Inverse-MSE weighted combination of member forecasters, per horizon.

    Each member's forecasts for the tracked horizons are scored when their target time arrives;
    `decay` is the weight of a new squared relative error in the running mean (0.05: roughly the
    last 20 answered forecasts count). Weights are 1 / MSE, normalised; until every member has
    `min_scored` scored forecasts at a horizon the members are weighted equally. Queried horizons
    between tracked ones use the nearest tracked horizon (in log distance).
    """

    kind = "ensemble"

    def __init__(
        self,
        members: dict[str, Forecaster],
        horizons_s: tuple[float, ...] | list[float] = DEFAULT_HORIZONS_S,
        decay: float = 0.05,
        min_scored: int = 6,
    ) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.members = dict(members)
        self.names = list(self.members)
        self.decay = float(decay)
        self.min_scored = int(min_scored)
        self.horizons = sorted(float(h) for h in horizons_s if h > 0)
        if not self.horizons:
            raise ValueError("an ensemble needs at least one positive horizon")
        n = len(self.names)
        self.mse: dict[float, list[float]] = {h: [0.0] * n for h in self.horizons}
        self.scored: dict[float, list[int]] = {h: [0] * n for h in self.horizons}
        self.pending: dict[float, deque[tuple[float, list[float | None]]]] = {h: deque() for h in self.horizons}
        self.last_issue: dict[float, float | None] = dict.fromkeys(self.horizons)
        self.level = 0.0
        self.dt_typ = 0.0
        self.t_last: float | None = None
        self.n = 0
        # Per-update memos: the policy asks for the same (t, h) point and upper forecast, and for the
        # weights of the same horizon, several times between two samples.
        self._memo: dict[tuple[float, float], float | None] = {}
        self._weights: dict[float, list[float]] = {}
        self._nearest: dict[float, float] = {}  # queried horizon -> tracked horizon (never changes)

    @property
    def ready(self) -> bool:
        return bool(self.members[self.names[0]].ready)

    @property
    def seasonal(self) -> bool:
        """Whether its full model knows a season: its first member's (Holt-Winters in `auto`)."""
        return bool(getattr(self.members[self.names[0]], "seasonal", False))

    def update(self, t_s: float, value: float | None) -> None:
        self._memo.clear()
        self._weights.clear()
        for m in self.members.values():
            m.update(t_s, value)
        sample = clean_sample(t_s, value)
        if sample is None or sample[1] is None:
            return
        t, y = sample
        if self.t_last is not None:
            if t < self.t_last:
                return
            if t > self.t_last:
                dt = t - self.t_last
                self.dt_typ = dt if self.dt_typ == 0 else self.dt_typ + 0.1 * (dt - self.dt_typ)
        self.level = y if self.n == 0 else self.level + 0.02 * (y - self.level)
        self.t_last = t
        self.n += 1
        scale = max(abs(self.level), 1e-9)
        late_ok = max(self.dt_typ, 1.0) * 1.01
        for h in self.horizons:
            pend = self.pending[h]
            while pend and pend[0][0] <= t + 1e-6:
                target, preds = pend.popleft()
                if t - target > late_ok:
                    continue  # answered only after a gap: not a fair score
                for i, p in enumerate(preds):
                    if p is None:
                        continue
                    e2 = ((y - p) / scale) ** 2
                    k = self.scored[h][i]
                    # plain mean until there is history, then exponential forgetting
                    w = max(self.decay, 1.0 / (k + 1))
                    self.mse[h][i] += w * (e2 - self.mse[h][i])
                    self.scored[h][i] = k + 1
            last = self.last_issue[h]
            if last is None or t - last >= max(h / 8.0, MIN_ISSUE_S):
                preds = [self.members[name].forecast(t, h) for name in self.names]
                pend.append((t + h, preds))
                self.last_issue[h] = t

    def weights(self, horizon_s: float) -> list[float]:
        """Member weights at this horizon (sum to 1)."""
        h = self._nearest.get(horizon_s)
        if h is None:
            h = min(self.horizons, key=lambda k: abs(math.log(k / horizon_s))) if horizon_s > 0 else self.horizons[0]
            if len(self._nearest) < 1024:
                self._nearest[horizon_s] = h
        cached = self._weights.get(h)
        if cached is None:
            cached = self._weights[h] = self._compute_weights(h)
        return cached

    def _compute_weights(self, h: float) -> list[float]:
        n = len(self.names)
        if min(self.scored[h]) < self.min_scored:
            return [1.0 / n] * n
        inv = [1.0 / max(m, 1e-12) for m in self.mse[h]]
        total = sum(inv)
        return [w / total for w in inv]

    def _combine(self, values: list[float | None], horizon_s: float) -> float | None:
        total = acc = 0.0
        seen = 0
        for w, v in zip(self.weights(horizon_s), values, strict=True):
            if v is not None:
                total += w
                acc += w * v
                seen += 1
        if seen == 0:
            return None
        if total <= 0:
            return sum(v for v in values if v is not None) / seen
        return max(0.0, acc / total)

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        if not valid_query(t_s, horizon_s):
            return None
        key = (t_s, horizon_s)
        if key not in self._memo:
            self._memo[key] = self._combine([self.members[n].forecast(t_s, horizon_s) for n in self.names], horizon_s)
        return self._memo[key]

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        """The weighted members' upper forecasts, raised to the highest member point forecast.

        When members disagree (the seasonal model sees the morning ramp coming, persistence does
        not) the combined point forecast sits between them; the disagreement is uncertainty, so it
        goes into the upper forecast, which the policy turns into warm pool.
        """
        if not valid_query(t_s, horizon_s):
            return None
        uppers = [self.members[n].forecast_upper(t_s, horizon_s, quantile) for n in self.names]
        points = [self.members[n].forecast(t_s, horizon_s) for n in self.names]
        combined = self._combine(uppers, horizon_s)
        point = self.forecast(t_s, horizon_s)
        if point is None:
            return None
        return max([point, combined if combined is not None else point] + [p for p in points if p is not None])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "params": {"horizons_s": self.horizons, "decay": self.decay, "min_scored": self.min_scored},
            "members": {name: self.members[name].to_dict() for name in self.names},
            "state": {
                "mse": [self.mse[h] for h in self.horizons],
                "scored": [self.scored[h] for h in self.horizons],
                "pending": [[[tg, preds] for tg, preds in self.pending[h]] for h in self.horizons],
                "last_issue": [self.last_issue[h] for h in self.horizons],
                "level": self.level,
                "dt_typ": self.dt_typ,
                "t_last": self.t_last,
                "n": self.n,
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnsembleForecaster:
        members = {name: forecaster_from_dict(m) for name, m in d["members"].items()}
        f = cls(members, **d["params"])
        s = d["state"]
        for i, h in enumerate(f.horizons):
            f.mse[h] = [float(x) for x in s["mse"][i]]
            f.scored[h] = [int(x) for x in s["scored"][i]]
            f.pending[h] = deque((float(tg), list(preds)) for tg, preds in s["pending"][i])
            f.last_issue[h] = s["last_issue"][i]
        f.level, f.dt_typ, f.t_last, f.n = s["level"], s["dt_typ"], s["t_last"], s["n"]
        return f
