"""The autoscalers users would otherwise pick, with their documented defaults, as `decide(obs)` policies.

Each follows /work/shared/design/REFERENCE.md (and the systems' own docs): Kubernetes HPA v2,
Knative KPA, KEDA's Prometheus trigger (which drives an HPA), AIBrix's predictive floor, a fixed fleet
sized for the trace's peak, and an oracle that knows the future rate and the next cold start. All are
given the same signal, the same per-replica target and the same target utilization; what differs is
how they turn it into replicas and what metrics pipeline they see (`metrics`). None has a warm pool.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from preheat.scaling.policy.terms import line
from preheat.scaling.policy.types import Decision, Observation, Reason
from preheat.sim.traces import ColdStartSampler


@dataclass(frozen=True)
class MetricView:
    """How a policy sees the signal: Prometheus-like scrape interval, rate window, query delay."""

    scrape_s: float = 15.0
    window_s: float = 60.0
    panic_window_s: float = 30.0  # two scrapes: the shortest rate() Prometheus can compute at 15 s
    delay_s: float = 5.0
    # The signal is the model servers' own counters (Preheat's queries): with no pod to scrape there is
    # no signal at all, as the operator sees it (no `up` target: NoMetrics, hold). Off: a signal that
    # counts requests without a pod (Knative's activator, Preheat's with scale to zero, an ingress
    # metric behind KEDA).
    needs_pods: bool = False

    def last_scrape(self, now: float) -> int:
        """Index k of the last scrape (at k x scrape_s) a query at `now` sees: one at least the query
        delay old. Below 1 there is none yet (the scrape at 0 has no rate window behind it)."""
        return math.floor((now - self.delay_s) / self.scrape_s)


PROMETHEUS = MetricView()
# Knative's autoscaler scrapes the queue-proxies itself every second and averages its own windows.
KNATIVE = MetricView(scrape_s=1.0, window_s=60.0, panic_window_s=6.0, delay_s=1.0)


@dataclass
class SimContext:
    """What the engine tells a policy before the run (only the oracle and fixed fleet use the future)."""

    target_per_replica: float
    target_utilization: float
    curve_t: np.ndarray  # true signal on a fine grid (the oracle's foresight)
    curve_rate: np.ndarray
    peak_rate: float  # the trace's peak signal over a 60 s window (sizes the fixed fleet)
    initial_rate: float  # signal over the first minutes (sizes every policy's starting fleet)
    cold_starts: ColdStartSampler
    max_replicas: int = 10_000

    def need(self, value: float) -> int:
        """Serving replicas that carry `value` at the target utilization."""
        if not math.isfinite(value) or value <= 0:
            return 0
        return math.ceil(value / (self.target_per_replica * self.target_utilization) - 1e-9)


def _decision(n: int, reason: Reason, detail: str, now: float, **kw: object) -> Decision:
    return Decision(serving=n, warm=0, reason=reason, detail=detail, time_s=now, **kw)  # type: ignore[arg-type]


class Baseline:
    """Shared plumbing: the engine calls `prepare`, `initial`, then `decide` every `interval_s`."""

    name = "baseline"
    interval_s = 15.0
    metrics = PROMETHEUS

    def prepare(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self.target = ctx.target_per_replica * ctx.target_utilization

    def initial(self) -> tuple[int, int]:
        return max(1, self.ctx.need(self.ctx.initial_rate)), 0

    def decide(self, obs: Observation) -> Decision:  # pragma: no cover - abstract
        raise NotImplementedError


class HPA(Baseline):
    """Kubernetes HPA v2 on an external metric with an AverageValue target (per-replica rate).

    desired = ceil(metric / target); no change while |metric / (target x current) - 1| <= 10 %.
    Scale-up at most max(+100 %, +4 pods) per 15 s; scale-down to the highest recommendation of the
    last 300 s. A missing metric means no scaling (the HPA logs the error and keeps the replicas).
    """

    name = "hpa"
    interval_s = 15.0
    tolerance = 0.1
    scale_down_stabilization_s = 300.0
    min_replicas = 1

    def __init__(self) -> None:
        self.current: int | None = None
        self._recs: deque[tuple[float, int]] = deque()

    def initial(self) -> tuple[int, int]:
        n, w = super().initial()
        self.current = n
        return n, w

    def metric(self, obs: Observation) -> float | None:
        return obs.value

    def decide(self, obs: Observation) -> Decision:
        now = obs.time_s
        current = self.current if self.current is not None else max(obs.current_serving, 1)
        value = self.metric(obs)
        if value is None or obs.stale or not math.isfinite(value) or value < 0:
            return _decision(current, Reason.HOLD, "hpa: metric unavailable, keeping replicas", now)
        ratio = value / (self.target * max(current, 1))
        if current > 0 and abs(ratio - 1.0) <= self.tolerance:
            rec, why = current, f"hpa: ratio {ratio:.2f} within tolerance"
        else:
            rec, why = math.ceil(value / self.target - 1e-9), f"hpa: ratio {ratio:.2f}"
        rec = max(rec, self.min_replicas)
        self._recs.append((now, rec))
        while self._recs and self._recs[0][0] <= now - self.scale_down_stabilization_s:
            self._recs.popleft()
        desired, reason = rec, Reason.REACTIVE
        if desired < current:
            stabilized = max(r for _, r in self._recs)
            if stabilized > desired:
                desired, reason = min(stabilized, current), Reason.STABILIZATION
        if desired > current:
            limit = max(2 * current, current + 4)
            if desired > limit:
                desired, why = limit, why + f", scale-up capped at {limit}"
        desired = min(desired, self.ctx.max_replicas)
        self.current = desired
        return _decision(desired, reason, f"{why} -> {desired}", now, reactive_need=rec)


class KEDA(HPA):
    """KEDA's Prometheus scaler: the query is polled every 30 s and fed to an HPA (its defaults).

    minReplicaCount defaults to 0: after `cooldownPeriod` (300 s) of a zero metric the workload goes
    to zero, and the first non-zero poll activates it back to one replica before the HPA takes over.
    """

    name = "keda"
    polling_interval_s = 30.0
    cooldown_s = 300.0
    min_replicas = 1  # the HPA's own minimum while active; KEDA handles 0 <-> 1

    def __init__(self) -> None:
        super().__init__()
        self._polled_at = -math.inf
        self._polled: float | None = None
        self._last_active = 0.0

    def metric(self, obs: Observation) -> float | None:
        if obs.time_s - self._polled_at >= self.polling_interval_s:
            self._polled_at, self._polled = obs.time_s, obs.value
        return self._polled

    def decide(self, obs: Observation) -> Decision:
        now = obs.time_s
        value = self.metric(obs)
        if value is not None and value > 0:
            self._last_active = now
        if self.current == 0:
            if value is not None and value > 0:
                self.current = 1
                return _decision(1, Reason.REACTIVE, "keda: activated from zero", now)
            return _decision(0, Reason.SCALE_TO_ZERO, "keda: idle, at zero", now)
        if value is not None and value == 0 and now - self._last_active >= self.cooldown_s:
            self.current = 0
            self._recs.clear()
            return _decision(0, Reason.SCALE_TO_ZERO, f"keda: zero for {self.cooldown_s:g}s cooldown", now)
        return super().decide(obs)


class KPA(Baseline):
    """Knative's KPA decider (rps metric): stable 60 s / panic 6 s windows, utilization 0.7-style target.

    Panic when the panic-window need is >= 200 % of ready pods; in panic never scale down; leave after a
    stable window without reason to panic. Scale up at most 1000x ready, down at most /2 per tick.
    Scale to zero (on by default) after the stable window sees no traffic plus a 30 s grace.
    """

    name = "kpa"
    interval_s = 2.0  # Knative's autoscaler tick
    metrics = KNATIVE
    panic_threshold = 2.0
    stable_window_s = 60.0
    max_scale_up_rate = 1000.0
    max_scale_down_rate = 2.0
    scale_to_zero_grace_s = 30.0

    def __init__(self) -> None:
        self.panic_since: float | None = None
        self.max_panic = 0
        self.zero_since: float | None = None
        self.current: int | None = None

    def initial(self) -> tuple[int, int]:
        n, w = super().initial()
        self.current = n
        return n, w

    def decide(self, obs: Observation) -> Decision:
        now = obs.time_s
        current = self.current if self.current is not None else obs.current_serving
        if obs.value is None or obs.stale:
            return _decision(current, Reason.HOLD, "kpa: no metrics, keeping scale", now)
        stable = obs.value
        panic = obs.value_panic if obs.value_panic is not None else stable
        ready = max(obs.serving_ready, 1)
        want_stable = math.ceil(stable / self.target - 1e-9)
        want_panic = math.ceil(panic / self.target - 1e-9)
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate)
        want_stable = min(max(want_stable, max_down), max_up)
        want_panic = min(max(want_panic, max_down), max_up)
        over = (panic / ready) / self.target >= self.panic_threshold
        if over:
            self.panic_since = now
        elif self.panic_since is not None and now - self.panic_since >= self.stable_window_s:
            self.panic_since, self.max_panic = None, 0
        if self.panic_since is not None:
            self.max_panic = max(self.max_panic, want_panic, current)
            desired, reason = self.max_panic, Reason.PANIC
        else:
            desired, reason = want_stable, Reason.REACTIVE
        if desired == 0:
            self.zero_since = now if self.zero_since is None else self.zero_since
            if now - self.zero_since < self.scale_to_zero_grace_s:
                desired, reason = max(current, 1) if current else 0, Reason.STABILIZATION
            else:
                reason = Reason.SCALE_TO_ZERO
        else:
            self.zero_since = None
        self.current = desired
        return _decision(desired, reason, f"kpa: stable {stable:.3g} panic {panic:.3g} -> {desired}", now,
                         reactive_need=want_stable, panic_need=want_panic, panic=self.panic_since is not None)


class AIBrix(HPA):
    """AIBrix predictive mode: a least-squares linear trend over the last 180 s, evaluated 120 s ahead,
    clamped to 0..4x the window mean, used only as a floor under the reactive (HPA-style) decision."""

    name = "aibrix"
    observe_window_s = 180.0
    horizon_s = 120.0
    max_ratio = 4.0

    def __init__(self) -> None:
        super().__init__()
        self._history: deque[tuple[float, float]] = deque()

    def decide(self, obs: Observation) -> Decision:
        now = obs.time_s
        reactive = super().decide(obs)
        if obs.value is None or obs.stale:
            return reactive
        self._history.append((now, obs.value))
        while self._history and self._history[0][0] < now - self.observe_window_s:
            self._history.popleft()
        if len(self._history) < 2:
            return reactive
        # the project's least-squares line (the one Preheat's short trend uses): np.polyfit on a dozen
        # points cost most of a 14-day sweep's time
        mt, mv, slope = line(self._history)
        projected = min(max(mv + slope * (now + self.horizon_s - mt), 0.0), self.max_ratio * mv)
        floor = math.ceil(projected / self.target - 1e-9)
        if floor > reactive.serving:
            self.current = min(floor, self.ctx.max_replicas)
            return _decision(self.current, Reason.FORECAST,
                             f"aibrix: trend projects {projected:.3g} at +{self.horizon_s:g}s -> {self.current}",
                             now, reactive_need=reactive.reactive_need, forecast_need=floor,
                             forecast_value=projected, lead_time_s=self.horizon_s)
        return Decision(**{**_fields(reactive), "forecast_value": projected, "forecast_need": floor})


def _fields(d: Decision) -> dict:
    return {f: getattr(d, f) for f in d.__slots__}  # type: ignore[attr-defined]


class Fixed(Baseline):
    """A fleet sized once for the trace's peak (60 s window) at the target utilization; never scales."""

    name = "fixed"
    interval_s = 3600.0

    def __init__(self, size: int | None = None) -> None:
        # An explicit size: the benchmark's always-on frontier (what a fleet of n replicas attains).
        self.requested_size = size

    def initial(self) -> tuple[int, int]:
        if self.requested_size is not None:
            self.size = max(1, int(self.requested_size))
        else:
            self.size = max(1, self.ctx.need(self.ctx.peak_rate))
        return self.size, 0

    def decide(self, obs: Observation) -> Decision:
        return _decision(self.size, Reason.BOUNDS, f"fixed fleet of {self.size}", obs.time_s)


class Oracle(Baseline):
    """Perfect foresight of the true signal and of the cold-start draws: the lower bound of the frontier.

    It sizes on the signal every other policy's target utilization refers to, the rate over a
    `PROMETHEUS.window_s` (60 s) window, here centred on each moment instead of lagging behind it. A
    ready replica is kept while the signal needs it before a replacement could be Ready (the next cold
    start); the j-th replica it would start gets the sampler's j-th next draw, so it is started now only
    if the signal needs it within that draw (a long draw does not make every replica wait for it).

    Two things made the earlier oracle cost more than causal policies (mooncake 300 s, deepseek measured):
    it sized on the peak of the 10 s bins over the whole horizon (a 310 s peak-hold of a noisy rate:
    near the trace's peak all the time, so even U = 1 cost more than the fixed fleet), and it held every
    replica for the longest of the next draws (one slow measured cold start kept the whole fleet up).
    """

    name = "oracle"
    interval_s = 5.0
    max_new_per_tick = 256  # more draws than any fleet here starts at once

    def __init__(self, window_s: float = PROMETHEUS.window_s) -> None:
        self.window_s = window_s

    def prepare(self, ctx: SimContext) -> None:
        super().prepare(ctx)
        t = ctx.curve_t
        step = float(t[1] - t[0]) if len(t) > 1 else 1.0
        r = np.nan_to_num(ctx.curve_rate)
        half = max(0, round(self.window_s / step / 2))
        cum = np.concatenate([[0.0], np.cumsum(r)])
        i = np.arange(len(r))
        lo, hi = np.maximum(i - half, 0), np.minimum(i + half + 1, len(r))
        self._signal = (cum[hi] - cum[lo]) / np.maximum(hi - lo, 1)
        self._t0, self._step = (float(t[0]) if len(t) else 0.0), step

    def _tick(self) -> float:
        # Two decision periods: its own tick, or the engine's grid when coarser (the fluid engine decides
        # once per 15 s step, so a replica is Ready at the first step after its draw, not 10 s after).
        return 2 * max(self.interval_s, self._step)

    def initial(self) -> tuple[int, int]:
        # The starting fleet covers what comes before a replica started at 0 could be Ready (with a
        # 300 s cold start on a short trace, nothing it starts later ever serves).
        horizon = self.ctx.cold_starts.peek() + self._tick()
        return self.ctx.need(self._peak(0.0, horizon)), 0

    def _peak(self, now: float, horizon: float) -> float:
        n = len(self._signal)
        lo = min(max(int((now - self._t0) // self._step), 0), n)
        hi = min(max(int((now + horizon - self._t0) // self._step) + 1, lo + 1), n)
        return float(self._signal[lo:hi].max()) if hi > lo else 0.0

    def decide(self, obs: Observation) -> Decision:
        now, tick = obs.time_s, self._tick()
        draws = self.ctx.cold_starts.upcoming(self.max_new_per_tick)
        horizon = draws[0] + tick
        # Kept while the signal needs it before a replacement could be Ready (the next draw); none where
        # no request comes within it: foresight scales to zero (KEDA and Knative do by default, so an
        # oracle that kept one replica cost more than KEDA on traffic with idle hours).
        n = self.ctx.need(self._peak(now, horizon))
        base = max(n, obs.current_serving)
        for j, cold in enumerate(draws, start=1):  # start the j-th new replica if needed within its draw
            if self.ctx.need(self._peak(now, cold + tick)) < base + j:
                break
            n, horizon = base + j, max(horizon, cold + tick)
        peak = self._peak(now, horizon)
        return _decision(n, Reason.FORECAST, f"oracle: true peak {peak:.3g} within {horizon:.0f}s -> {n}", now,
                         forecast_value=peak, forecast_need=n, lead_time_s=horizon)


BASELINES: dict[str, type[Baseline]] = {
    "hpa": HPA,
    "kpa": KPA,
    "keda": KEDA,
    "aibrix": AIBrix,
    "fixed": Fixed,
    "oracle": Oracle,
}
