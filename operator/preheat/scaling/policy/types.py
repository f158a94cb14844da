"""The policy's vocabulary: its configuration, what it observes, what it decides, and its memory.

Everything here is a plain value (frozen dataclasses, an enum) so the operator can persist it, the
simulator can replay it, and tests can build it without a cluster.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from preheat.scaling.policy.window import TimeWindow


class Reason(StrEnum):
    """The term that won a decision (the operator counts decisions by it)."""

    REACTIVE = "reactive"  # the signal now, divided by per-replica capacity
    FORECAST = "forecast"  # the forecast at now + lead time
    PANIC = "panic"  # a short-window burst of at least panic_threshold x current serving
    BOUNDS = "bounds"  # min_replicas / max_replicas clamped the result
    STABILIZATION = "stabilization"  # scale-down held back by the window or the max scale-down rate
    WARM_POOL = "warmPool"  # serving unchanged, the warm pool changed
    HOLD = "hold"  # missing, stale or invalid data: keep what we have
    SCALE_TO_ZERO = "scaleToZero"  # no traffic for the grace period and none forecast within lead time
    BURST = "burst"  # serving unchanged, the warm pool holds the recent bursts' short-window need (envelope)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """How one InferenceEndpoint scales. Units of `target_per_replica` are the signal's units.

    The signal is whatever the endpoint scales on (requests/s, tokens/s or concurrency); the policy
    only ever divides it by `target_per_replica * target_utilization`.
    """

    min_replicas: int = 1
    max_replicas: int = 10
    target_per_replica: float = 1.0
    target_utilization: float = 0.8
    decision_interval_s: float = 15.0
    forecasting: bool = True
    quantile: float = 0.9
    horizon_override_s: float | None = None
    # Size serving for the forecast peak over (now, now + max(lead time, this)]: looking further than
    # the lead time pre-scales a daily ramp earlier, at the price of replicas ordered sooner.
    forecast_window_s: float | None = None
    # Put the upper-quantile margin into serving replicas on top of the target utilization's headroom
    # (costlier, safer). Default: serving is sized by the point forecast at the target utilization U (U
    # is the serving headroom), and the margin waits in the warm pool where a warm replica is cheaper.
    margin_in_serving: bool = False
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    # Scale-down stabilization window (HPA's rule: the highest recommendation within it wins). None:
    # HPA's 300 s; when forecasting 1 + 1/U lead times (two at U = 1; at least 300 s without the noise
    # floor below; scale_down.stabilization_window_s, scale_down.hold_lead_times).
    scale_down_stabilization_s: float | None = None
    max_scale_down_rate: float = 2.0
    warm_pool_min: int = 0
    warm_pool_max: int = 0
    scale_to_zero: bool = False
    scale_to_zero_grace_s: float = 600.0
    # Scale to zero only while the upper forecast over the lead time stays below this share of one
    # replica's capacity (forecasters rarely predict an exact zero).
    idle_forecast_fraction: float = 0.05
    default_cold_start_s: float = 60.0
    cold_start_quantile: float = 0.9
    # Requests one serving replica runs at once (the model server's concurrency slots, e.g. vLLM's
    # max_num_seqs). With it, and `running`/`queue` in the observation (vllm:num_requests_running and
    # vllm:num_requests_waiting, scraped every few seconds), the panic path also sizes for the
    # requests present now: a burst shows in the queue seconds before any 60 s rate moves.
    concurrency_per_replica: float | None = None
    # How many cold starts per serving replica the queue alone may order at once. 0: the queue only
    # promotes warm replicas (seconds); cold starts come from the rate signals and the forecast.
    # Higher values buy SLO attainment on sub-minute bursts with many more replica-seconds.
    queue_cold_start_rate: float = 0.0
    # Burst envelope (0 = off): on bursty traffic (a short-window need of at least burst_threshold x
    # the stable need, or requests waiting while every slot is busy) keep loaded capacity, serving +
    # warm, at the highest such short-window need of the last burst_memory_s. It lives in the warm
    # pool (bounded by warm_pool_max and max_replicas) and lapses after burst_memory_s without a burst.
    burst_memory_s: float = 0.0
    burst_threshold: float = 1.5
    # Fast panic path (None = off): between full decisions, every panic_interval_s, requests waiting
    # while every slot is busy promote Ready warm replicas (`decide_panic`); nothing else changes.
    panic_interval_s: float | None = None
    # What a warm replica costs relative to a serving one (1.0: a GPU held idle costs the same; below 1:
    # a CPU warm pool resized down in place). The policy keeps headroom in the warm pool only when it
    # is cheaper there than in serving replicas.
    warm_cost_fraction: float = 1.0
    # Prometheus' scrape interval: with half the stable window, the signal's own lag (in the lead time).
    scrape_interval_s: float = 15.0
    # A least-squares line through the signal over this many seconds floors the point forecast (AIBrix's
    # short trend; terms.trend_floor): while the forecaster has no season yet (it forecasts the level)
    # projected by the signal's lag + one interval; with its season projected over the lead time, as a
    # hedge against a surge the season does not hold that the scale-down window does not hold (warm
    # margin instead where a warm replica pays; terms.forecast_with_trend). 0: off.
    trend_window_s: float = 300.0
    # A scale-down below what serves goes no lower than the need at the signal (or the forecast) plus
    # this many standard deviations of the signal's noise around its short trend (Shewhart's 3 sigma:
    # a dip within the noise is not evidence that demand fell). It replaces HPA's 300 s floor under
    # the default forecasting window; a configured window has none (scale_down.noise_floor_on). 0: off.
    scale_down_noise_sigmas: float = 3.0

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid PolicyConfig: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this configuration is invalid, in words a user can act on (empty when valid)."""
        out: list[str] = []

        def finite(name: str, lo: float | None = None, lo_open: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                out.append(f"{name} must be a finite number, got {v!r}")
            elif lo is not None and (v <= lo if lo_open else v < lo):
                out.append(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v!r}")

        for name in ("min_replicas", "max_replicas", "warm_pool_min", "warm_pool_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                out.append(f"{name} must be a non-negative integer, got {v!r}")
        finite("target_per_replica", 0.0, lo_open=True)
        finite("target_utilization", 0.0, lo_open=True)
        finite("decision_interval_s", 0.0, lo_open=True)
        finite("stable_window_s", 0.0, lo_open=True)
        finite("panic_window_s", 0.0, lo_open=True)
        finite("panic_threshold", 1.0, lo_open=True)
        finite("max_scale_up_rate", 1.0)
        finite("max_scale_down_rate", 1.0)
        finite("scale_to_zero_grace_s", 0.0)
        finite("idle_forecast_fraction", 0.0)
        finite("default_cold_start_s", 0.0)
        finite("queue_cold_start_rate", 0.0)
        finite("burst_memory_s", 0.0)
        finite("burst_threshold", 1.0)
        finite("warm_cost_fraction", 0.0, lo_open=True)
        finite("scrape_interval_s", 0.0)
        finite("trend_window_s", 0.0)
        finite("scale_down_noise_sigmas", 0.0)
        if not out:
            if self.target_utilization > 1.0:
                out.append(f"target_utilization must be <= 1, got {self.target_utilization!r}")
            if self.max_replicas < 1:
                out.append("max_replicas must be at least 1")
            if self.min_replicas > self.max_replicas:
                out.append(f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})")
            if self.warm_pool_min > self.warm_pool_max:
                out.append(f"warm_pool_min ({self.warm_pool_min}) exceeds warm_pool_max ({self.warm_pool_max})")
            if not 0.0 < self.warm_cost_fraction <= 1.0:
                out.append(f"warm_cost_fraction must be in (0, 1], got {self.warm_cost_fraction!r}")
            if self.panic_window_s > self.stable_window_s:
                out.append("panic_window_s must not exceed stable_window_s")
        for name in ("quantile", "cold_start_quantile"):
            q = getattr(self, name)
            if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 < q < 1.0:
                out.append(f"{name} must be strictly between 0 and 1, got {q!r}")
        def optional(name: str, positive: bool) -> None:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                                  or (v <= 0 if positive else v < 0)):
                kind = "a positive" if positive else "a non-negative"
                out.append(f"{name} must be None or {kind} number, got {v!r}")

        optional("forecast_window_s", positive=False)
        optional("concurrency_per_replica", positive=True)
        optional("panic_interval_s", positive=True)
        optional("horizon_override_s", positive=False)
        optional("scale_down_stabilization_s", positive=False)
        return out

    @property
    def capacity_per_replica(self) -> float:
        """Signal one serving replica should carry at the target utilization."""
        return self.target_per_replica * self.target_utilization

    @property
    def margin_serves(self) -> bool:
        """Whether the forecast's upper-quantile margin goes into serving replicas (`margin_in_serving`).
        By default it does not: the target utilization already leaves 1 - U of every serving replica as
        headroom, and sizing serving by the upper quantile as well paid for the same margin twice
        (measured: 20-25 % more replica-hours than KEDA at the same U, and no cheaper at a given SLO)."""
        return self.margin_in_serving

    def warm_pays(self, lead_s: float) -> bool:
        """Whether capacity beyond `warm_pool_min` is worth keeping warm at this lead time: only when a warm
        replica costs less than the protection it buys, `warm_cost_fraction` < `warm_value(lead_s)`.
        At the same price a warm replica buys nothing a serving one would not (it serves only after a
        promotion), so the forecast's margin (and the queue's promotions, on loan) wait in the warm pool
        only when it is cheaper than that; otherwise the policy is the one it runs at a warm cost of 1."""
        if self.warm_cost_fraction >= 1.0 or self.margin_in_serving:
            return False
        return self.warm_cost_fraction < self.warm_value(lead_s)

    def warm_value(self, lead_s: float) -> float:
        """What a warm replica is worth against a serving one, as a share of the serving one's price.

        A surprise above the forecast is served at once by serving headroom; by a warm replica once the
        signal shows it and a decision promotes it; by a new replica only after the whole lead time. So
        of the lead time during which a serving replica protects against a surprise, a warm one protects
        for all but that reaction time: (lead - reaction) / lead. The reaction time is one decision
        interval plus the time a step in demand takes to show in full in the signal (the whole stable
        window and a scrape; the promotion itself takes seconds). With the defaults a 30 s cold start
        (lead 90 s) gives 0, a 300 s one (lead 360 s) 0.75."""
        if not (isinstance(lead_s, int | float) and math.isfinite(lead_s) and lead_s > 0.0):
            return 0.0
        reaction = self.decision_interval_s + self.stable_window_s + self.scrape_interval_s
        return min(1.0, max(0.0, (lead_s - reaction) / lead_s))

    @property
    def signal_lag_s(self) -> float:
        """How old the demand a decision sees is: a rate over the stable window lags the present by
        half the window, and the value reaches the policy up to one scrape later."""
        return self.stable_window_s / 2.0 + self.scrape_interval_s

    @property
    def floor_replicas(self) -> int:
        """Fewest serving replicas while there is (or may be) traffic: scale to zero is separate."""
        return max(self.min_replicas, 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown PolicyConfig fields: {', '.join(unknown)}")
        return cls(**d)

    def with_(self, **changes: Any) -> PolicyConfig:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the policy sees at one decision.

    `value` is the signal averaged over the stable window (e.g. 60 s), `value_panic` over the short
    panic window (e.g. 6 s). Counts are pods of this endpoint: `current_serving` is the Ready pods
    labelled serving (new pods start warm and are promoted when Ready, so no starting pod is labelled
    serving; the operator and the simulator report the same), `serving_ready`/`warm_ready` are Ready
    pods by role and `starting` are pods created but not yet Ready (never counted as capacity).
    `queue` is requests waiting for a slot and `running` requests being served, summed over the
    serving replicas (the model server's gauges, read every few seconds); None when unknown.
    """

    time_s: float
    value: float | None
    value_panic: float | None = None
    stale: bool = False
    serving_ready: int = 0
    warm_ready: int = 0
    starting: int = 0
    current_serving: int = 0
    cold_start_samples_s: tuple[float, ...] = ()
    queue: float | None = None
    running: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cold_start_samples_s"] = list(self.cold_start_samples_s)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Observation:
        d = dict(d)
        d["cold_start_samples_s"] = tuple(d.get("cold_start_samples_s") or ())
        return cls(**d)


@dataclass(frozen=True, slots=True)
class Decision:
    """Desired replica counts and why. `total` is what the Deployment's replicas should be."""

    serving: int
    warm: int
    reason: Reason
    detail: str
    reactive_need: int = 0
    forecast_need: int = 0
    panic_need: int = 0
    forecast_value: float | None = None
    forecast_upper: float | None = None
    lead_time_s: float = 0.0
    panic: bool = False
    # Of the serving replicas to add, how many the operator can take from Ready warm pods (promotion,
    # seconds) rather than start cold (minutes).
    promote: int = 0
    time_s: float = 0.0

    @property
    def total(self) -> int:
        return self.serving + self.warm

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = str(self.reason)
        d["total"] = self.total
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        d = {k: v for k, v in d.items() if k != "total"}
        d["reason"] = Reason(d["reason"])
        return cls(**d)


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy remembers between decisions (all of it; `decide` is otherwise pure).

    `serving_recommendations` and `total_recommendations` hold (time, replicas) of recent
    unstabilized recommendations for the scale-down stabilization window, kept as a monotone queue
    (only entries that can still be the window's maximum), so their length stays small.
    `last_data_s` is when the last decision on fresh data was made (None before the first).
    """

    last_serving: int | None = None
    last_warm: int | None = None
    panic_since: float | None = None
    panic_last_over: float | None = None
    panic_max: int = 0
    zero_since: float | None = None
    serving_recommendations: TimeWindow = field(default_factory=TimeWindow)
    total_recommendations: TimeWindow = field(default_factory=TimeWindow)
    cold_start_samples_s: tuple[float, ...] = field(default=())
    # Time of the last decision made on fresh data. A gap (holds in between) does not age the
    # stabilization windows: the window measures observed time (see scale_down.resume_after_gap).
    last_data_s: float | None = None
    # (time, short-window need) of recent bursts, a monotone max-queue over burst_memory_s.
    burst_needs: TimeWindow = field(default_factory=TimeWindow)
    # (time, signal) of the fresh observations within trend_window_s (the short trend's samples).
    recent_signal: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        # Windows given as plain (time, value) tuples (tests, restored state) become TimeWindows.
        for key in ("serving_recommendations", "total_recommendations", "burst_needs"):
            value = getattr(self, key)
            if not isinstance(value, TimeWindow):
                object.__setattr__(self, key, TimeWindow(value))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["serving_recommendations"] = [list(r) for r in self.serving_recommendations]
        d["total_recommendations"] = [list(r) for r in self.total_recommendations]
        d["burst_needs"] = [list(r) for r in self.burst_needs]
        d["cold_start_samples_s"] = list(self.cold_start_samples_s)
        d["recent_signal"] = [list(r) for r in self.recent_signal]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyState:
        d = dict(d)
        for key in ("serving_recommendations", "total_recommendations", "burst_needs"):
            d[key] = tuple((float(t), int(n)) for t, n in d.get(key, ()))
        d["cold_start_samples_s"] = tuple(float(x) for x in d.get("cold_start_samples_s", ()))
        d["recent_signal"] = tuple((float(t), float(v)) for t, v in d.get("recent_signal", ()))
        return cls(**d)
