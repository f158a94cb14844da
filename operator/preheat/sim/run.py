"""The simulation engines: replay a trace through one policy on the shared fleet model.

Per-request traces run event by event (a heap of completions, replica transitions and decision ticks,
merged with the sorted arrivals; one central FIFO queue in front of the serving replicas, which models
least-outstanding-requests routing). Per-window series run in a time-stepped fluid model: arrivals and
service are flows, and each request's queueing delay is read exactly off the cumulative arrival and
departure curves (FIFO), so a 14-day series is a few hundred thousand cheap steps.

Every policy sees the signal through its own metrics pipeline (`MetricView`: scrape interval, rate
window, query delay) and is asked for a decision every `interval_s`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from preheat.scaling.policy.types import Decision, Observation
from preheat.sim.baselines import BASELINES, MetricView, SimContext
from preheat.sim.bursts import bursty_flow, step_cv
from preheat.sim.fleet import DAY_S, SERVING, FleetConfig, ReplicaPool
from preheat.sim.preheat_policy import PreheatPolicy
from preheat.sim.traces import ColdStartModel, RequestTrace, SeriesTrace, Trace

# Fluid model resolution: decisions and replica transitions land on this grid, so a policy that ticks
# faster (Knative's 2 s, the oracle's 5 s) is asked once per step. 15 s is the usual scrape interval.
FLUID_STEP_S = 15.0
CURVE_STEP_S = 10.0  # resolution of the true-rate curve (plots, oracle, ramp lead)
POLICY_NAMES = ("preheat", "hpa", "kpa", "keda", "aibrix", "fixed", "oracle")


class SimPolicy(Protocol):
    name: str
    interval_s: float
    metrics: MetricView

    def prepare(self, ctx: SimContext) -> None: ...
    def initial(self) -> tuple[int, int]: ...
    def decide(self, obs: Observation) -> Decision: ...


# What every policy aims at without --spec or --target-utilization (Knative's default target utilization).
DEFAULT_TARGET_UTILIZATION = 0.7


@dataclass(frozen=True)
class SimSettings:
    """Everything about a run except the trace, the policy and the cold starts."""

    slo_ms: float = 5000.0
    capacity_rps: float | None = None  # per replica, flat out; None = auto
    capacity_tps: float | None = None  # scale on tokens/s instead
    slots: int | None = None  # per-request model: concurrency per replica; None = from the capacity
    target_utilization: float = DEFAULT_TARGET_UTILIZATION  # what every policy aims at (the frontier sweeps it)
    peak_replicas: int = 20  # auto capacity: the trace's peak needs this many serving replicas at...
    sizing_utilization: float = 0.7  # ...this utilization (fixed, so a sweep of the target keeps the fleet)
    prefill_tokens_per_s: float = 40_000.0
    decode_s_per_token: float = 0.025
    service_s: float = 1.0
    first_token_s: float = 0.2
    promotion_s: float = 2.0
    max_replicas: int = 1000
    seed: int = 0
    preheat_overrides: dict[str, Any] = field(default_factory=dict)
    # A warm replica's cost relative to a serving one (1.0: a GPU held idle). Billing and Preheat's policy.
    warm_cost_fraction: float = 1.0
    bursty: bool = True  # series: draw each step's arrivals with the window's recorded inter-arrival CV
    spec: Any = None  # an InferenceEndpointSpec for Preheat (None: the CRD's defaults)
    # A warm-up: every policy runs from the trace's start, but only requests arriving from here on are
    # scored and only replica-seconds from here on billed (a short log starts every autoscaled fleet at
    # the first minutes' need, before any has seen the traffic; a running endpoint has).
    score_after_s: float = 0.0


@dataclass
class SimResult:
    policy: str
    requests: float
    slo_attainment: float
    p50_latency_ms: float | None
    p99_latency_ms: float | None
    replica_seconds: float
    replica_seconds_by_state: dict[str, float]
    scale_actions: int
    scale_ups: int
    scale_downs: int
    cold_starts: int
    promotions: int
    decisions: int
    reasons: dict[str, int]
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of this run (one core): the fair speed figure on a shared machine
    ramp_lead_s: list[float] | None = None
    days: list[dict[str, float]] = field(default_factory=list)  # `per_day`: where cost and misses fall
    timeline: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def summary(self) -> dict[str, Any]:
        keys = ("requests", "slo_attainment", "p50_latency_ms", "p99_latency_ms", "replica_seconds",
                "replica_seconds_by_state", "scale_actions", "scale_ups", "scale_downs", "cold_starts",
                "promotions", "decisions", "reasons", "wall_s", "cpu_s")
        out = {k: getattr(self, k) for k in keys}
        out["cold_starts_hidden_by_promotions"] = self.promotions
        if self.ramp_lead_s is not None:
            out["ramp_lead_s"] = self.ramp_lead_s
            out["ramp_lead_median_s"] = float(np.median(self.ramp_lead_s)) if self.ramp_lead_s else None
        out["days"] = self.days
        return out


@dataclass(frozen=True)
class Workload:
    """A trace prepared for simulation: the fleet's physics and the signal policies scale on."""

    trace: Trace
    fleet: FleetConfig
    signal: str  # "rps" or "tps"
    target_per_replica: float  # in signal units
    curve_t: np.ndarray
    curve_rate: np.ndarray  # true signal per CURVE_STEP_S bin (NaN = missing)
    peak_rate: float
    initial_rate: float
    service_s: np.ndarray | None = None  # per request: slot time
    prefill_s: np.ndarray | None = None  # per request: time to first token without queueing
    weights: np.ndarray | None = None  # per request: signal units (1 or tokens)

    def describe(self) -> str:
        unit = "req/s" if self.signal == "rps" else "tokens/s"
        parts = [f"per-replica capacity {self.target_per_replica:.4g} {unit} flat out"]
        if isinstance(self.trace, RequestTrace):
            parts.append(f"{self.fleet.slots} slots, mean slot time {float(np.mean(self.service_s)):.2f} s")
        parts.append(f"peak {self.peak_rate:.4g} {unit} (60 s)")
        return ", ".join(parts)


class SimError(ValueError):
    """Settings that cannot describe a fleet for this trace (clear message, CLI exit 2)."""


def _rolling_peak(t: np.ndarray, w: np.ndarray, window_s: float) -> float:
    """Highest signal averaged over any `window_s` window starting at an arrival."""
    cum = np.concatenate([[0.0], np.cumsum(w)])
    end = np.searchsorted(t, t + window_s, side="left")
    return float(np.max(cum[end] - cum[np.arange(len(t))]) / window_s)


def prepare_workload(trace: Trace, s: SimSettings) -> Workload:
    """Derive the fleet (capacity, slots, service times) and the true-signal curve for a trace."""
    if s.capacity_rps is not None and s.capacity_tps is not None:
        raise SimError("give --capacity-rps or --capacity-tps, not both")
    for name in ("capacity_rps", "capacity_tps"):
        v = getattr(s, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise SimError(f"--{name.replace('_', '-')} must be a positive number, got {v!r}")
    if not (0 < s.target_utilization <= 1):
        raise SimError(f"--target-utilization must be in (0, 1], got {s.target_utilization!r}")
    if not (math.isfinite(s.slo_ms) and s.slo_ms > 0):
        raise SimError(f"--slo-ms must be a positive number, got {s.slo_ms!r}")
    if not (math.isfinite(s.score_after_s) and s.score_after_s >= 0
            and (s.score_after_s == 0 or s.score_after_s < trace.duration_s)):
        raise SimError(f"--score-after must be at least 0 s and before the trace ends ({trace.duration_s:g} s), "
                       f"got {s.score_after_s!r}")
    signal = "tps" if s.capacity_tps is not None else "rps"
    fleet_kw = dict(prefill_tokens_per_s=s.prefill_tokens_per_s, decode_s_per_token=s.decode_s_per_token,
                    service_s=s.service_s, first_token_s=s.first_token_s, promotion_s=s.promotion_s,
                    slo_s=s.slo_ms / 1000.0)
    if isinstance(trace, SeriesTrace):
        if signal == "tps":
            raise SimError(f"--capacity-tps needs a per-request trace with token counts; {trace.name} is a rate series")
        step = FLUID_STEP_S
        n = math.ceil(trace.duration_s / step)
        t = np.arange(n) * step
        mids = trace.t_s + trace.window_s / 2
        ok = np.isfinite(trace.rate_rps)
        rate = np.interp(t + step / 2, mids[ok], trace.rate_rps[ok])
        window_idx = np.minimum((t // trace.window_s).astype(int), len(trace.rate_rps) - 1)
        rate[~ok[window_idx]] = np.nan
        if s.bursty:  # arrivals inside each window as bursty as the trace recorded (sim/bursts.py)
            rate = bursty_flow(rate, step_cv(trace, t), step, s.seed)
        peak = float(np.nanmax(trace.rate_rps))
        if s.capacity_rps is None and not peak > 0:
            raise SimError(f"series {trace.name} has no traffic (every rate is 0): a replica cannot be sized "
                           "from its peak; give --capacity-rps")
        initial = float(np.nanmean(rate[: max(1, int(300 / step))])) if np.any(np.isfinite(rate[:60])) else peak
        cap = s.capacity_rps or peak / (s.sizing_utilization * s.peak_replicas)
        fleet = FleetConfig(capacity_rps=cap, slots=s.slots or 1, **fleet_kw)
        return Workload(trace, fleet, signal, cap, t, rate, peak, initial)
    # per-request
    arr = trace.arrival_s
    if trace.has_tokens:
        inp, out = trace.input_tokens, trace.output_tokens
        prefill = inp / s.prefill_tokens_per_s
        service = prefill + out * s.decode_s_per_token
    else:
        if signal == "tps":
            raise SimError(f"--capacity-tps needs token counts; {trace.name} has none")
        prefill = np.full(len(arr), s.first_token_s)
        service = np.full(len(arr), s.service_s)
    weights = np.ones(len(arr)) if signal == "rps" else (trace.input_tokens + trace.output_tokens)
    mean_service = float(np.mean(service))
    mean_weight = float(np.mean(weights))
    peak = _rolling_peak(arr, weights, 60.0)
    if s.capacity_rps is not None or s.capacity_tps is not None:
        target = float(s.capacity_rps or s.capacity_tps)
        slots = s.slots or max(1, round(target * mean_service / mean_weight))
    elif s.slots is not None:
        slots = s.slots
        target = slots * mean_weight / mean_service
    else:
        want = peak / (s.sizing_utilization * s.peak_replicas)
        slots = max(1, round(want * mean_service / mean_weight))
        target = slots * mean_weight / mean_service  # what `slots` slots really serve
    fleet = FleetConfig(capacity_rps=target / mean_weight, slots=int(slots), **fleet_kw)
    nb = math.ceil((trace.duration_s + 1e-9) / CURVE_STEP_S) or 1
    sums = np.bincount(np.minimum((arr // CURVE_STEP_S).astype(int), nb - 1), weights=weights, minlength=nb)
    curve_t = np.arange(nb) * CURVE_STEP_S
    first = arr < min(300.0, trace.duration_s + 1e-9)
    initial = float(weights[first].sum() / max(min(300.0, trace.duration_s), 1.0))
    return Workload(trace, fleet, signal, target, curve_t, sums / CURVE_STEP_S, peak, initial,
                    service, prefill, weights)


def make_policy(name: str, s: SimSettings, w: Workload, cold: ColdStartModel) -> SimPolicy:
    if name == "preheat":
        return PreheatPolicy(w, cold, s.preheat_overrides, s.spec, s.warm_cost_fraction)
    if name not in BASELINES:
        raise SimError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)} or all")
    return BASELINES[name]()


class _Signal:
    """The true signal as cumulative counts, read the way a metrics pipeline would read it.

    A scraped value only changes every `scrape_s`, so each MetricView's stable and panic rates are
    computed once for all scrape times (vectorised) and looked up at decision time.
    """

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.end = w.trace.duration_s + 3600.0
        self._tables: dict[MetricView, tuple[np.ndarray, np.ndarray]] = {}
        if isinstance(w.trace, RequestTrace):
            self.t = w.trace.arrival_s
            self.cum = np.concatenate([[0.0], np.cumsum(w.weights)])
            self.grid = False
        else:
            flow = np.nan_to_num(w.curve_rate) * FLUID_STEP_S
            self.edges = np.arange(len(flow) + 1) * FLUID_STEP_S
            self.cum = np.concatenate([[0.0], np.cumsum(flow)])
            self.miss = np.concatenate([[0], np.cumsum(~np.isfinite(w.curve_rate))])
            self.grid = True

    def _counts(self, x: np.ndarray) -> np.ndarray:
        if self.grid:
            return np.interp(x, self.edges, self.cum)
        return self.cum[np.searchsorted(self.t, x, side="right")]

    def _rates(self, ends: np.ndarray, window: float) -> np.ndarray:
        starts = np.maximum(ends - window, 0.0)
        span = ends - starts
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (self._counts(ends) - self._counts(starts)) / span
        r[span <= 0] = np.nan
        if self.grid:
            n = len(self.miss) - 1
            i0 = np.clip((starts // FLUID_STEP_S).astype(int), 0, n)
            i1 = np.clip(np.ceil(ends / FLUID_STEP_S).astype(int), 0, n)
            r[self.miss[i1] - self.miss[i0] > 0] = np.nan  # window touches a logging gap: no data
        return r

    def _table(self, view: MetricView) -> tuple[np.ndarray, np.ndarray]:
        if view not in self._tables:
            ends = np.arange(0.0, self.end + view.scrape_s, view.scrape_s)
            self._tables[view] = (self._rates(ends, view.window_s), self._rates(ends, view.panic_window_s))
        return self._tables[view]

    def observe(self, now: float, view: MetricView) -> tuple[float | None, float | None]:
        k = view.last_scrape(now)
        if k < 1:
            return None, None
        stable, panic = self._table(view)
        k = min(k, len(stable) - 1)
        s, p = float(stable[k]), float(panic[k])
        return (s if s == s else None), (p if p == p else None)


class _Recorder:
    """Decision-time samples for plots, scale-action counts and reasons."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self.last_total: int | None = None
        self.ups = self.downs = 0
        self.reasons: dict[str, int] = {}

    def record(self, now: float, obs: Observation, d: Decision, pool: ReplicaPool) -> None:
        total = d.serving + d.warm
        if self.last_total is not None and total != self.last_total:
            if total > self.last_total:
                self.ups += 1
            else:
                self.downs += 1
        self.last_total = total
        self.reasons[str(d.reason)] = self.reasons.get(str(d.reason), 0) + 1
        fv = d.forecast_value if d.forecast_value is not None else math.nan
        val = obs.value if obs.value is not None else math.nan
        self.rows.append((now, val, fv, pool.serving_ready, pool.warm_ready, pool.starting, d.serving, d.warm))

    def arrays(self) -> dict[str, np.ndarray]:
        a = np.asarray(self.rows, dtype=float).reshape(-1, 8)
        names = ("t", "observed", "forecast", "serving_ready", "warm_ready", "starting", "desired_serving", "desired_warm")
        return {n: a[:, i] for i, n in enumerate(names)}


def _observation(
    now: float, sig: _Signal, view: MetricView, pool: ReplicaPool, queue: float | None, running: float | None = None
) -> Observation:
    if view.needs_pods and not pool.replicas:
        # nothing to scrape: the operator's `count(up == 1)` is empty, its observation stale (NoMetrics)
        return _gauges(now, pool, queue, running, stale=True)
    stable, panic = sig.observe(now, view)
    return _gauges(now, pool, queue, running, value=stable, value_panic=panic)


def _gauges(now: float, pool: ReplicaPool, queue: float | None, running: float | None,
            value: float | None = None, value_panic: float | None = None, stale: bool = False) -> Observation:
    """Pod counts and the model server's gauges; the rate signal only when a full decision reads it
    (the fast panic path reads the gauges alone)."""
    return Observation(
        time_s=now, value=value, value_panic=value_panic, stale=stale,
        serving_ready=pool.serving_ready, warm_ready=pool.warm_ready, starting=pool.starting,
        current_serving=pool.observed_serving, cold_start_samples_s=tuple(pool.observed_cold_starts), queue=queue,
        running=running,
    )


def _running(pool: ReplicaPool) -> float:
    """Requests in a slot of a serving replica (vllm:num_requests_running summed over the Service)."""
    return float(sum(r.busy for r in pool.replicas.values() if r.state == SERVING))


def _context(w: Workload, s: SimSettings, sampler) -> SimContext:
    return SimContext(w.target_per_replica, s.target_utilization, w.curve_t, w.curve_rate, w.peak_rate,
                      w.initial_rate, sampler, s.max_replicas)


def simulate(w: Workload, policy: SimPolicy, cold: ColdStartModel, s: SimSettings) -> SimResult:
    """Run one policy over the workload and score it."""
    import time

    started = time.perf_counter()
    cpu_started = time.process_time()
    sampler = cold.sampler(s.seed)
    policy.prepare(_context(w, s, sampler))
    serving0, warm0 = policy.initial()
    pool = ReplicaPool(sampler, w.fleet.promotion_s)
    pool.horizon_s = w.trace.duration_s
    pool.billing_from_s = s.score_after_s
    pool.seed(0.0, serving0, warm0)
    rec = _Recorder()
    if isinstance(w.trace, RequestTrace):
        latencies, weights, arrivals = _run_requests(w, policy, pool, rec)
    else:
        latencies, weights, arrivals = _run_fluid(w, policy, pool, rec)
    slo = w.fleet.slo_s
    tl = rec.arrays()
    tl.update(_violations_timeline(arrivals, latencies > slo, weights, w))
    scored = arrivals >= s.score_after_s
    latencies, weights = latencies[scored], weights[scored]
    total = float(weights.sum())
    ok = float(weights[latencies <= slo].sum())
    p50, p99 = _weighted_quantiles(latencies, weights, (0.5, 0.99))
    result = SimResult(
        policy=policy.name, requests=total, slo_attainment=ok / total if total else 1.0,
        p50_latency_ms=None if p50 is None else p50 * 1000, p99_latency_ms=None if p99 is None else p99 * 1000,
        replica_seconds=pool.cost_seconds(s.warm_cost_fraction), replica_seconds_by_state=dict(pool.replica_seconds),
        scale_actions=rec.ups + rec.downs, scale_ups=rec.ups, scale_downs=rec.downs,
        cold_starts=pool.cold_starts, promotions=pool.promotions, decisions=len(rec.rows), reasons=rec.reasons,
        timeline=tl, days=per_day(pool, arrivals[scored], latencies > slo, weights, s.warm_cost_fraction),
    )
    if isinstance(w.trace, SeriesTrace) and w.trace.duration_s >= 2 * 86400:
        result.ramp_lead_s = ramp_leads(w, tl, s.target_utilization)
    result.wall_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu_started
    return result


def per_day(pool: ReplicaPool, arrivals: np.ndarray, late: np.ndarray, weights: np.ndarray,
            warm_cost_fraction: float) -> list[dict[str, float]]:
    """Each day of the trace (from its start): the requests scored, those that missed the SLO and the
    replica-seconds paid for. A 99 % SLO over two weeks is often lost on one or two days; this says which."""
    cost = pool.cost_by_day(warm_cost_fraction)
    day = (arrivals // DAY_S).astype(int)
    n = 1 + max(max(cost, default=-1), int(day.max()) if len(day) else -1)
    requests = np.bincount(day, weights=weights, minlength=n)
    missed = np.bincount(day, weights=weights * late, minlength=n)
    return [{"day": d, "requests": float(requests[d]), "late": float(missed[d]),
             "replica_seconds": float(cost.get(d, 0.0))} for d in range(n)]


def _weighted_quantiles(x: np.ndarray, w: np.ndarray, qs: tuple[float, ...]) -> list[float | None]:
    keep = w > 0
    x, w = x[keep], w[keep]
    if len(x) == 0:
        return [None for _ in qs]
    order = np.argsort(x)
    x, cw = x[order], np.cumsum(w[order])
    out: list[float | None] = []
    for q in qs:
        v = float(x[min(int(np.searchsorted(cw, q * cw[-1])), len(x) - 1)])
        out.append(v if math.isfinite(v) else None)
    return out


def _violations_timeline(arrivals: np.ndarray, bad: np.ndarray, weights: np.ndarray, w: Workload) -> dict[str, np.ndarray]:
    bins = w.curve_t
    width = float(bins[1] - bins[0]) if len(bins) > 1 else CURVE_STEP_S
    idx = np.minimum((arrivals // width).astype(int), len(bins) - 1)
    viol = np.bincount(idx, weights=weights * bad, minlength=len(bins))[: len(bins)]
    return {"curve_t": bins, "curve_rate": w.curve_rate, "violations_per_s": viol / width}


# --- per-request engine ----------------------------------------------------------------------------------

_DONE, _WAKE, _DECIDE, _PANIC, _SCRAPE = 0, 1, 2, 3, 4


class _ScrapedGauges:
    """The model servers' gauges (requests waiting, running) as a decision reads them from Prometheus:
    sampled at each scrape, and read at the last scrape a query sees (`MetricView.last_scrape`), as the
    rate signal is. The operator's `queue` and `running` queries are instant
    queries over scraped series, so the requests present a decision sees are up to a scrape and a
    delay old, not the engine's current queue."""

    def __init__(self, view: MetricView) -> None:
        self.view = view
        self.samples: deque[tuple[int, float, float]] = deque(maxlen=64)  # (scrape index, waiting, running)

    def scrape(self, k: int, waiting: float, running: float) -> None:
        self.samples.append((k, waiting, running))

    def read(self, now: float) -> tuple[float | None, float | None]:
        """(waiting, running) at the last scrape a query at `now` sees; (None, None) before the first."""
        k = self.view.last_scrape(now)
        for j, waiting, running in reversed(self.samples):
            if j <= k:
                return waiting, running
        return None, None


def _run_requests(w: Workload, policy: SimPolicy, pool: ReplicaPool, rec: _Recorder):
    """The per-request engine: arrivals and events in time order, each request to the least busy serving
    replica with a free slot, else FIFO. Billing is piecewise-constant in the replica counts, so the pool
    is billed only before something can change them (a decision, a transition, a draining replica's last
    request), not at every arrival and request end: the same replica-seconds summed in fewer pieces
    (billing at every event was a third of a run's CPU time on a 3 M-request log)."""
    arrivals_np = w.trace.arrival_s
    # Python floats in the loop: indexing a list is several times cheaper than a numpy scalar, and the
    # arithmetic is the same IEEE double arithmetic.
    arrivals, service, prefill = arrivals_np.tolist(), w.service_s.tolist(), w.prefill_s.tolist()
    slots = w.fleet.slots
    n = len(arrivals)
    ttft = [math.inf] * n
    sig = _Signal(w)
    queue: deque[int] = deque()
    events: list[tuple[float, int, int, Any]] = []
    seq = 0
    end = w.trace.duration_s
    give_up = end + 3600.0  # requests not started an hour after the trace ends count as violations

    def push(t: float, kind: int, data: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    def start(i: int, r, now: float) -> None:
        r.busy += 1
        ttft[i] = now - arrivals[i] + prefill[i]
        push(now + service[i], _DONE, r)

    def fill(now: float) -> None:
        if not queue:
            return
        for r in list(pool.replicas.values()):
            while queue and r.state == SERVING and r.busy < slots:
                start(queue.popleft(), r, now)

    scheduled: set[float] = set()
    # Policies that read the model servers' gauges (Preheat) read them as scraped (`_ScrapedGauges`).
    gauges = _ScrapedGauges(policy.metrics) if getattr(policy, "reads_gauges", False) else None

    def wake() -> None:
        # one timer at the next replica transition (a start finishing or a promotion landing)
        t = pool.next_transition_s
        if t < math.inf and t not in scheduled:
            scheduled.add(t)
            push(t, _WAKE, None)

    push(0.0, _DECIDE, None)
    if gauges is not None:
        push(gauges.view.scrape_s, _SCRAPE, 1)
    # A policy with a fast panic path (Preheat's panic_interval_s) is also asked every
    # panic_interval_s between decisions, on the model server's gauges only.
    panic_s = getattr(policy, "panic_interval_s", None)
    if panic_s is not None and panic_s < policy.interval_s:
        push(panic_s, _PANIC, None)
    i = 0
    while True:
        t_arr = arrivals[i] if i < n else math.inf
        t_evt = events[0][0] if events else math.inf
        if t_arr <= t_evt:
            if t_arr == math.inf:
                break
            now = t_arr  # an arrival changes no replica count: nothing to bill
            best = None
            for r in pool.replicas.values():
                if r.state == SERVING and r.busy < slots and (best is None or r.busy < best.busy):
                    best = r
            if best is not None and not queue:
                start(i, best, now)
            else:
                queue.append(i)
            i += 1
            continue
        now, _, kind, data = heapq.heappop(events)
        if now > give_up:
            break
        if kind == _DONE:
            data.busy -= 1
            if data.state == SERVING and queue:
                start(queue.popleft(), data, now)
            else:
                pool.released(data, now)
            continue
        if kind == _SCRAPE:  # changes no replica count: nothing to bill
            gauges.scrape(data, float(len(queue)), _running(pool))  # type: ignore[union-attr]
            if i < n or queue:
                push((data + 1) * gauges.view.scrape_s, _SCRAPE, data + 1)  # type: ignore[union-attr]
            continue
        pool.bill(now)
        if kind == _WAKE:
            scheduled.discard(now)
            if pool.advance(now):
                fill(now)
            wake()
        elif kind == _PANIC:
            if i >= n and not queue:
                continue
            # fresh gauges: a loop between decisions (simulator-only, off by default) would read the pods
            # themselves, as Knative's autoscaler reads its queue-proxies, not Prometheus
            obs = _gauges(now, pool, float(len(queue)), _running(pool))
            d = policy.panic_decide(obs)
            if d is not None:
                pool.apply(now, d.serving, d.warm)
                rec.record(now, obs, d, pool)
                if pool.advance(now):
                    fill(now)
                wake()
            push(now + panic_s, _PANIC, None)
        else:  # decide
            if i >= n and not queue:
                continue  # trace over and everyone served: stop ticking
            # the model server's gauges: requests in a slot (running) and waiting for one (queue), as
            # scraped for a policy that reads them
            waiting, running = gauges.read(now) if gauges is not None else (float(len(queue)), _running(pool))
            obs = _observation(now, sig, policy.metrics, pool, waiting, running)
            d = policy.decide(obs)
            pool.apply(now, d.serving, d.warm)
            rec.record(now, obs, d, pool)
            if pool.advance(now):
                fill(now)
            fill(now)
            wake()
            push(now + policy.interval_s, _DECIDE, None)
    # Bill only the trace's span so every policy pays for the same window.
    pool.bill(end)
    return np.array(ttft), w.weights if w.signal == "rps" else np.ones(n), arrivals_np


# --- fluid engine ---------------------------------------------------------------------------------------


def _run_fluid(w: Workload, policy: SimPolicy, pool: ReplicaPool, rec: _Recorder):
    dt = FLUID_STEP_S
    rate = w.curve_rate
    n = len(rate)
    arriving = np.nan_to_num(rate) * dt
    cap_per_replica = w.fleet.capacity_rps * dt
    sig = _Signal(w)
    served = np.zeros(n)  # work started in each step (FIFO)
    backlog = 0.0
    next_decision = 0.0
    interval = policy.interval_s
    for k in range(n):
        now = k * dt
        pool.advance(now)
        if now >= next_decision:
            obs = _observation(now, sig, policy.metrics, pool, backlog)
            d = policy.decide(obs)
            pool.apply(now, d.serving, d.warm)
            pool.advance(now)
            rec.record(now, obs, d, pool)
            next_decision = now + interval
        pool.bill(now)
        available = backlog + arriving[k]
        done = min(available, pool.count[SERVING] * cap_per_replica)
        served[k] = done
        backlog = available - done
    pool.bill(n * dt)
    # Exact FIFO delays off the cumulative curves: the x-th request arrives when A(t) = x and starts
    # when D(t) = x. Each step's arrivals are split in 4 equal parts to resolve delays within a step.
    t_edges = np.arange(n + 1) * dt
    cum_a = np.concatenate([[0.0], np.cumsum(arriving)])
    cum_d = np.concatenate([[0.0], np.cumsum(served)])
    parts = 4
    frac = (np.arange(parts) + 0.5) / parts
    pos = (cum_a[:-1, None] + arriving[:, None] * frac[None, :]).ravel()
    t_arr = (t_edges[:-1, None] + dt * frac[None, :]).ravel()
    t_start = np.interp(pos, cum_d, t_edges, right=math.inf)
    unserved = pos > cum_d[-1] + 1e-9
    t_start[unserved] = math.inf
    # A request arriving at t cannot start before t (fluid curves may touch within a step).
    delay = np.maximum(t_start - t_arr, 0.0)
    latency = delay + w.fleet.first_token_s
    weights = np.repeat(arriving / parts, parts)
    return latency, weights, t_arr


def ramp_leads(w: Workload, tl: dict[str, np.ndarray], utilization: float) -> list[float]:
    """Per day: how long before demand reached the midpoint of its daily ramp did ready serving
    capacity (at the target utilization) cover that level? Positive = capacity arrived first."""
    t, rate = w.curve_t, w.curve_rate
    cap_t = tl["t"]
    cap = tl["serving_ready"] * w.target_per_replica * utilization
    leads: list[float] = []
    for day0 in np.arange(0, w.trace.duration_s - 86400 + 1, 86400):
        m = (t >= day0) & (t < day0 + 86400) & np.isfinite(rate)
        if m.sum() < 100:
            continue
        td, rd = t[m], rate[m]
        ipk = int(np.argmax(rd))
        if ipk == 0:
            continue
        itr = int(np.argmin(rd[:ipk]))
        trough, peak = rd[itr], rd[ipk]
        if peak < 1.3 * trough:
            continue  # no real ramp that day
        level = trough + 0.5 * (peak - trough)
        t_dem = td[itr + int(np.argmax(rd[itr:ipk + 1] >= level))]
        cm = (cap_t >= td[itr]) & (cap_t <= t_dem + 3 * 3600)
        if not cm.any():
            continue
        ct, cv = cap_t[cm], cap[cm]
        covered = cv >= level
        upto = ct <= t_dem
        if upto.any() and covered[upto][-1]:
            # covered when demand got there: since when, without a break?
            uncovered = np.where(~covered & upto)[0]
            t_cap = ct[uncovered[-1] + 1] if len(uncovered) else ct[0]
        else:
            later = covered & ~upto
            if not later.any():
                continue
            t_cap = ct[int(np.argmax(later))]
        leads.append(float(t_dem - t_cap))
    return leads
