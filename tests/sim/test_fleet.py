"""Fleet model behaviours: cold starts delay capacity, promotions are fast, queueing counts violations."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.sim.baselines import Fixed
from preheat.sim.fleet import ReplicaPool
from preheat.sim.run import SimSettings, prepare_workload, simulate
from preheat.sim.traces import load_cold_start, load_trace

from .tracegen import write_requests, write_series


def pool(cold: float = 30.0, promotion: float = 2.0) -> ReplicaPool:
    return ReplicaPool(load_cold_start(str(cold)).sampler(0), promotion)


def test_cold_start_delays_capacity():
    p = pool(cold=30.0)
    p.seed(0.0, serving=1, warm=0)
    p.apply(10.0, serving=3, warm=0)
    assert p.serving_ready == 1 and p.starting == 2 and p.current_serving == 3
    p.advance(39.9)
    assert p.serving_ready == 1  # not Ready before the cold start is over
    became = p.advance(40.0)
    assert len(became) == 2 and p.serving_ready == 3 and p.starting == 0
    assert p.cold_starts == 2
    assert list(p.observed_cold_starts)[-2:] == [30.0, 30.0]


def test_promotion_is_fast_and_hides_a_cold_start():
    p = pool(cold=30.0, promotion=2.0)
    p.seed(0.0, serving=1, warm=2)
    p.apply(100.0, serving=3, warm=0)
    assert p.cold_starts == 0 and p.promotions == 2
    p.advance(102.0)
    assert p.serving_ready == 3  # two seconds, not thirty
    # the warm pool is refilled with cold starts when the policy still wants it
    p.apply(110.0, serving=3, warm=2)
    assert p.cold_starts == 2 and p.count["starting"] == 2


def test_scale_down_cancels_starting_first_and_demotes_into_warm_pool():
    p = pool(cold=30.0)
    p.seed(0.0, serving=4, warm=0)
    p.apply(10.0, serving=6, warm=0)
    p.apply(15.0, serving=4, warm=0)
    assert p.cancelled_starts == 2 and p.serving_ready == 4 and p.starting == 0
    p.apply(20.0, serving=2, warm=1)
    assert p.serving_ready == 2 and p.warm_ready == 1 and p.demotions == 1


def test_billing_counts_starting_warm_and_serving():
    p = pool(cold=30.0)
    p.seed(0.0, serving=1, warm=1)
    p.apply(0.0, serving=1, warm=2)  # one cold start into the warm pool
    p.advance(30.0)
    p.bill(100.0)
    assert p.replica_seconds["serving"] == pytest.approx(100)
    assert p.replica_seconds["starting"] == pytest.approx(30)
    assert p.replica_seconds["warm"] == pytest.approx(100 + 70)
    assert p.total_seconds() == pytest.approx(300)


def test_queueing_counts_slo_violations(tmp_path):
    # 40 requests in one second at a single one-slot replica with 1 s of service each: the queue
    # makes most of them wait longer than the 5 s budget.
    times = np.concatenate([np.linspace(0, 100, 50), np.linspace(120, 121, 40), np.linspace(200, 300, 50)])
    tr = load_trace(write_requests(tmp_path / "burst.csv", times, inp=40, out=40))
    s = SimSettings(slots=1, slo_ms=5000, decode_s_per_token=0.025, prefill_tokens_per_s=40_000)
    w = prepare_workload(tr, s)
    cold = load_cold_start("30")
    r = simulate(w, Fixed(), cold, s)
    bad = 1 - r.slo_attainment
    assert 0.1 < bad < 0.5
    assert r.p99_latency_ms > 5000 > r.p50_latency_ms


class Const(Fixed):
    """A fleet of exactly `n` serving replicas, whatever the trace."""

    def __init__(self, n: int) -> None:
        self.size = n

    def initial(self) -> tuple[int, int]:
        return self.size, 0


def test_fluid_overload_queues_and_recovers(tmp_path):
    # 100 req/s for an hour, 300 req/s for 30 min, 100 req/s again; replicas serve 40 req/s flat out.
    tr = load_trace(write_series(tmp_path / "s.csv", [100.0] * 6 + [300.0] * 3 + [100.0] * 6))
    cold = load_cold_start("30")
    s = SimSettings(capacity_rps=40.0)
    w = prepare_workload(tr, s)
    enough = simulate(w, Const(8), cold, s)  # 320 req/s: never queues
    assert enough.slo_attainment == 1.0
    short = simulate(w, Const(6), cold, s)  # 240 req/s against a 300 req/s peak: the backlog grows
    assert 0.0 < short.slo_attainment < 1.0
    assert short.p99_latency_ms > 5000
    viol = short.timeline["violations_per_s"]
    t = short.timeline["curve_t"]
    assert viol[t < 3000].sum() == 0  # before the peak nothing waits
    assert viol[t > 6 * 3600 - 600].sum() == 0  # the backlog drains once demand is back at 100 req/s


def test_billing_by_day_splits_at_midnight_and_adds_up():
    p = pool(cold=30.0)
    p.seed(0.0, serving=2, warm=1)
    p.bill(86_000.0)
    p.apply(86_000.0, serving=3, warm=1)  # the warm replica promoted, one cold start to refill the pool
    p.advance(86_030.0)
    p.bill(86_400.0 + 600.0)
    days = p.cost_by_day(1.0)
    assert list(days) == [0, 1]
    # three replicas until 86,000 s, then four (starting or not) across midnight
    assert days[0] == pytest.approx(3 * 86_000 + 4 * 400)
    assert days[1] == pytest.approx(4 * 600)
    assert sum(p.cost_by_day(0.5).values()) == pytest.approx(p.cost_seconds(0.5))
    assert p.cost_by_day(0.5)[1] == pytest.approx(3.5 * 600)  # the warm one at half price


def test_per_day_puts_the_misses_and_the_cost_on_the_day_they_happen(tmp_path):
    # three days at 100 req/s, with an hour at 300 req/s on day 1 only; a fixed fleet of 6 x 40 req/s
    day = [100.0] * 144
    rates = day + day[:60] + [300.0] * 6 + day[66:] + day
    tr = load_trace(write_series(tmp_path / "s.csv", rates))
    s = SimSettings(capacity_rps=40.0)
    w = prepare_workload(tr, s)
    r = simulate(w, Const(6), load_cold_start("30"), s)
    assert [d["day"] for d in r.days] == [0, 1, 2]
    assert r.days[0]["late"] == 0 and r.days[2]["late"] == 0 and r.days[1]["late"] > 0
    assert sum(d["late"] for d in r.days) == pytest.approx((1 - r.slo_attainment) * r.requests)
    assert sum(d["requests"] for d in r.days) == pytest.approx(r.requests)
    assert r.days[1]["requests"] > r.days[0]["requests"]
    for d in r.days:  # a constant fleet pays the same every full day
        assert d["replica_seconds"] == pytest.approx(6 * 86_400)
    assert sum(d["replica_seconds"] for d in r.days) == pytest.approx(r.replica_seconds)
