"""Whole runs: the oracle beats every autoscaler on attainment; Preheat's warm pool hides cold starts."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.scaling.policy.types import Decision, Observation, Reason
from preheat.sim.baselines import PROMETHEUS
from preheat.sim.run import POLICY_NAMES, SimError, SimSettings, make_policy, prepare_workload, simulate
from preheat.sim.traces import load_cold_start, load_trace

from .tracegen import write_requests, write_series


def poisson_steps(rng: np.random.Generator, pieces: list[tuple[float, float]]) -> np.ndarray:
    """Poisson arrivals: (duration_s, rate_rps) pieces back to back."""
    out, t0 = [], 0.0
    for dur, rate in pieces:
        n = rng.poisson(dur * rate)
        out.append(t0 + np.sort(rng.random(n)) * dur)
        t0 += dur
    return np.concatenate(out)


def run_all(path, settings: SimSettings, cold: str = "30"):
    w = prepare_workload(load_trace(path), settings)
    c = load_cold_start(cold)
    return {name: simulate(w, make_policy(name, settings, w, c), c, settings) for name in POLICY_NAMES}


def test_oracle_at_least_as_good_as_every_autoscaler(tmp_path):
    rng = np.random.default_rng(7)
    times = poisson_steps(rng, [(300, 2.0), (120, 12.0), (300, 3.0), (60, 15.0), (300, 2.0)])
    path = write_requests(tmp_path / "steps.csv", times, inp=400, out=40)
    results = run_all(path, SimSettings(slots=2, slo_ms=3000))
    oracle = results["oracle"].slo_attainment
    for name in ("preheat", "hpa", "kpa", "keda", "aibrix"):
        assert oracle >= results[name].slo_attainment, name
    # reactive scalers pay for the 30 s cold starts on the steps; the oracle does not
    assert results["hpa"].slo_attainment < oracle
    for r in results.values():
        assert r.requests == len(times)
        assert r.replica_seconds > 0 and r.decisions > 0


def test_preheat_promotes_from_its_warm_pool(tmp_path):
    # a daily-shaped series over 3 days: with warm replicas cheaper than serving ones and a cold start
    # long enough for a warm one to pay (300 s: worth 0.67 of a serving one at a 60 s interval), Preheat
    # keeps the forecast's margin in a warm pool and promotes from it on the ramps
    hours = np.arange(72 * 6) / 6.0
    rates = 100 + 80 * np.sin(2 * np.pi * (hours - 6) / 24).clip(min=-0.8)
    path = write_series(tmp_path / "daily.csv", list(rates))
    s = SimSettings(preheat_overrides={"decision_interval_s": 60.0}, warm_cost_fraction=0.4)  # fewer decisions: faster
    w = prepare_workload(load_trace(path), s)
    c = load_cold_start("300")
    pre = simulate(w, make_policy("preheat", s, w, c), c, s)
    assert pre.promotions > 0
    assert pre.replica_seconds_by_state["warm"] > 0
    hpa = simulate(w, make_policy("hpa", s, w, c), c, s)
    assert hpa.replica_seconds_by_state["warm"] == 0 and hpa.promotions == 0
    assert pre.ramp_lead_s is not None and len(pre.ramp_lead_s) >= 2


def test_preheat_fast_panic_path_promotes_warm_replicas_between_decisions(tmp_path):
    # quiet traffic with short bursts: queued requests promote the warm pool every 3 s in between
    # the 15 s decisions, without changing the Deployment's total (no cold start from the fast path)
    rng = np.random.default_rng(3)
    times = poisson_steps(rng, [(200, 1.0), (8, 25.0), (150, 1.0), (8, 25.0), (150, 1.0)])
    path = write_requests(tmp_path / "bursts.csv", times, inp=400, out=40)
    runs = {}
    for fast in (None, 3.0):
        s = SimSettings(slots=1, preheat_overrides={"warm_pool_min": 3, "warm_pool_max": 3, "panic_interval_s": fast,
                                                    "burst_memory_s": 0.0})
        w = prepare_workload(load_trace(path), s)
        c = load_cold_start("30")
        runs[fast] = simulate(w, make_policy("preheat", s, w, c), c, s)
    tl = runs[3.0].timeline
    off_grid = np.nonzero(np.mod(tl["t"], 15.0) > 1e-9)[0]
    assert len(off_grid) > 0 and runs[3.0].promotions > 0
    totals = tl["desired_serving"] + tl["desired_warm"]
    for k in off_grid:
        assert k > 0 and totals[k] == totals[k - 1]  # promotions only: the total stays
        assert tl["desired_serving"][k] > tl["desired_serving"][k - 1]
    assert np.all(np.mod(runs[None].timeline["t"], 15.0) < 1e-9)  # off: decisions on the 15 s grid only
    # every fast-path call that acts counts as a panic decision
    assert runs[3.0].reasons.get("panic", 0) >= len(off_grid)


def test_score_after_leaves_the_warm_up_unscored_and_unbilled(tmp_path):
    """`--score-after S`: every policy runs from the start, but only requests arriving from S count and
    replicas are billed from S. A burst in the first minute that one replica cannot serve is a miss
    without the warm-up and not scored with it; a fixed fleet pays for exactly the scored span."""
    from preheat.sim.baselines import Fixed

    rng = np.random.default_rng(3)
    times = poisson_steps(rng, [(60, 5.0), (600, 0.3)])  # one replica serves ~2 req/s
    path = write_requests(tmp_path / "burst_first.csv", times, inp=400, out=40)
    c = load_cold_start("30")
    by_after = {}
    for after in (0.0, 300.0):
        s = SimSettings(slots=2, slo_ms=3000, score_after_s=after)
        w = prepare_workload(load_trace(path), s)
        by_after[after] = simulate(w, Fixed(1), c, s), w.trace.duration_s
    (all_, duration), (warm, _) = by_after[0.0], by_after[300.0]
    assert all_.slo_attainment < 0.8 and warm.slo_attainment == 1.0
    assert warm.requests == np.count_nonzero(times - times.min() >= 300.0) < all_.requests == len(times)
    assert all_.replica_seconds == pytest.approx(duration)
    assert warm.replica_seconds == pytest.approx(duration - 300.0)


@pytest.mark.parametrize("after", [-1.0, 1e6, float("nan")])
def test_score_after_outside_the_trace_is_refused(tmp_path, after):
    path = write_requests(tmp_path / "t.csv", np.arange(0.0, 100.0, 1.0))
    with pytest.raises(SimError, match="--score-after"):
        prepare_workload(load_trace(path), SimSettings(score_after_s=after))


def test_a_trace_of_one_instant_is_scored_without_a_warm_up(tmp_path):
    """A log whose requests share one timestamp lasts 0 s: scored from 0, as before --score-after."""
    path = write_requests(tmp_path / "one.csv", np.array([5.0, 5.0]))
    s = SimSettings()
    w = prepare_workload(load_trace(path), s)
    c = load_cold_start("30")
    r = simulate(w, make_policy("hpa", s, w, c), c, s)
    assert r.requests == 2 and r.slo_attainment == 1.0


class _ScaleDownAt:
    """A scripted policy: `before` serving replicas until `at_s`, then `after` (nothing else decides)."""

    name, interval_s = "scripted", 15.0

    def __init__(self, before: int, after: int, at_s: float) -> None:
        self.metrics, self.before, self.after, self.at_s = PROMETHEUS, before, after, at_s

    def prepare(self, ctx: object) -> None:
        self.ctx = ctx

    def initial(self) -> tuple[int, int]:
        return self.before, 0

    def decide(self, obs: Observation) -> Decision:
        n = self.before if obs.time_s < self.at_s else self.after
        return Decision(serving=n, warm=0, reason=Reason.REACTIVE, detail="scripted", time_s=obs.time_s)


def test_a_replica_removed_while_busy_is_billed_draining_until_its_last_request_ends(tmp_path):
    """The per-request engine bills only before replica counts can change (not at every arrival): a replica
    scaled away while it serves drains, and is paid for until the request it holds ends, not until the
    next event after that. Two 100 s requests on two replicas, one replica removed at the 15 s decision,
    a last request at 300 s (the trace's end): 300 + 15 s serving, and draining from 15 s to the end of
    the removed replica's request (at 100.0025 or 100.5025 s, whichever it held)."""
    path = write_requests(tmp_path / "long.csv", np.array([0.0, 0.5, 300.0]), inp=100, out=4000)
    s = SimSettings(slots=1, slo_ms=3000)
    w = prepare_workload(load_trace(path), s)
    c = load_cold_start("30")
    r = simulate(w, _ScaleDownAt(2, 1, 10.0), c, s)
    service = 100 / s.prefill_tokens_per_s + 4000 * s.decode_s_per_token
    by_state = r.replica_seconds_by_state
    assert by_state["serving"] == pytest.approx(315.0)
    assert min(abs(by_state["draining"] - (start + service - 15.0)) for start in (0.0, 0.5)) < 1e-6
    assert r.replica_seconds == pytest.approx(315.0 + by_state["draining"])
    assert r.slo_attainment == 1.0


def test_preheat_reads_the_queue_as_scraped_not_as_it_is_now(tmp_path):
    # The operator reads vllm:num_requests_waiting from Prometheus: a decision sees the queue of the last
    # scrape at least the query delay old (15 s scrape, 5 s delay), as it sees the rate signal. A burst
    # landing just after the scrape at 15 s is queued at the 30 s decision but first seen at the 45 s one.
    rng = np.random.default_rng(3)
    steady = np.sort(rng.random(30)) * 16.0
    burst = 16.0 + np.sort(rng.random(200)) * 0.5
    path = write_requests(tmp_path / "burst.csv", np.concatenate([steady, burst]), inp=100, out=400)
    s = SimSettings(slots=2, slo_ms=3000, capacity_rps=0.5)
    w = prepare_workload(load_trace(path), s)
    c = load_cold_start("30")
    policy = make_policy("preheat", s, w, c)
    seen: list[Observation] = []
    decide = policy.decide
    policy.decide = lambda obs: (seen.append(obs), decide(obs))[1]  # type: ignore[method-assign]
    simulate(w, policy, c, s)
    queue = {round(o.time_s): o.queue for o in seen}
    assert queue[0] is None and queue[15] is None  # no scrape old enough yet
    assert queue[30] == 0.0  # the scrape at 15 s, before the burst; the engine's queue is long by now
    assert queue[45] is not None and queue[45] > 0  # the scrape at 30 s holds the burst's queue
