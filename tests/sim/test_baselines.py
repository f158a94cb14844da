"""Each baseline's defining behaviour, driven by hand-made observations (no fleet needed)."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.scaling.policy import Observation, Reason
from preheat.sim.baselines import HPA, KEDA, KPA, AIBrix, Fixed, SimContext
from preheat.sim.traces import load_cold_start


def ctx(target: float = 10.0) -> SimContext:
    # utilization 1.0 so that one replica carries exactly `target` and the arithmetic stays readable
    return SimContext(target, 1.0, np.arange(10.0), np.zeros(10), 100.0, 40.0, load_cold_start("30").sampler(0))


def obs(t: float, value: float | None, panic: float | None = None, ready: int = 4) -> Observation:
    return Observation(time_s=t, value=value, value_panic=panic, serving_ready=ready, current_serving=ready)


def ready(policy, c: SimContext | None = None):
    policy.prepare(c or ctx())
    policy.initial()  # 40 req/s at 10 per replica -> 4 replicas
    return policy


def test_hpa_tolerance_keeps_replicas_within_ten_percent():
    hpa = ready(HPA())
    assert hpa.decide(obs(15, 43.0)).serving == 4  # ratio 1.075: inside the 10 % tolerance
    assert hpa.decide(obs(30, 37.0)).serving == 4  # ratio 0.925
    assert hpa.decide(obs(45, 46.0)).serving == 5  # ratio 1.15: scale to ceil(46 / 10)


def test_hpa_scale_up_rate_limit():
    hpa = ready(HPA())
    assert hpa.decide(obs(15, 400.0)).serving == 8  # max(+100 %, +4 pods) from 4
    assert hpa.decide(obs(30, 400.0)).serving == 16
    assert hpa.decide(obs(45, 400.0)).serving == 32
    assert hpa.decide(obs(60, 400.0)).serving == 40


def test_hpa_scale_down_stabilization_window():
    hpa = ready(HPA())
    assert hpa.decide(obs(0, 80.0)).serving == 8
    held = [hpa.decide(obs(t, 20.0)) for t in range(15, 300, 15)]
    assert all(d.serving == 8 for d in held)  # the 80 req/s recommendation is still in the window
    assert held[0].reason == Reason.STABILIZATION
    assert hpa.decide(obs(300, 20.0)).serving == 2  # the window has passed: down in one step


def test_hpa_missing_metric_holds():
    hpa = ready(HPA())
    d = hpa.decide(obs(15, None))
    assert d.serving == 4 and d.reason == Reason.HOLD


def test_kpa_panic_never_scales_down_and_exits_after_stable_window():
    kpa = ready(KPA())
    d = kpa.decide(obs(0, 40.0, panic=90.0))  # panic need 9 >= 2 x 4 ready
    assert d.panic and d.serving == 9
    d = kpa.decide(obs(2, 40.0, panic=50.0, ready=9))  # burst over, but still panicking: hold 9
    assert d.panic and d.serving == 9
    d = kpa.decide(obs(59, 30.0, panic=30.0, ready=9))
    assert d.panic and d.serving == 9
    d = kpa.decide(obs(61, 30.0, panic=30.0, ready=9))  # a stable window without reason to panic
    assert not d.panic and d.serving == 4  # 30 / 10 = 3, but at most halve per tick (9 // 2 = 4)


def test_kpa_stable_mode_follows_the_stable_window():
    kpa = ready(KPA())
    d = kpa.decide(obs(0, 60.0, panic=70.0))  # 7 / 4 < 200 %: no panic
    assert not d.panic and d.serving == 6


def test_kpa_scales_to_zero_after_grace():
    kpa = ready(KPA())
    kpa.decide(obs(0, 10.0, panic=10.0, ready=1))
    assert kpa.decide(obs(10, 0.0, panic=0.0, ready=1)).serving == 1  # within the 30 s grace
    assert kpa.decide(obs(40, 0.0, panic=0.0, ready=1)).serving == 0


def test_aibrix_trend_is_a_floor_never_a_ceiling():
    rising = ready(AIBrix())
    for i, t in enumerate(range(0, 181, 15)):
        d = rising.decide(obs(t, 40.0 + 2.0 * i))
    # reactive says ceil(64 / 10) = 7; the trend (+2 per 15 s) projects 64 + 16 = 80 at +120 s
    assert d.reactive_need == 7
    assert d.serving == 8 and d.reason == Reason.FORECAST
    assert d.forecast_value == pytest.approx(80.0)
    falling = ready(AIBrix())
    for i, t in enumerate(range(0, 181, 15)):
        d = falling.decide(obs(t, 100.0 - 5.0 * i))
    hpa = ready(HPA())
    for i, t in enumerate(range(0, 181, 15)):
        ref = hpa.decide(obs(t, 100.0 - 5.0 * i))
    assert d.serving == ref.serving  # a falling trend never lowers the reactive decision


def test_keda_polls_every_30s_and_scales_to_zero_after_cooldown():
    keda = ready(KEDA())
    assert keda.decide(obs(0, 80.0)).serving == 8
    assert keda.decide(obs(15, 200.0)).serving == 8  # value from the poll at t=0 is reused until t=30
    assert keda.decide(obs(30, 200.0)).serving == 16
    keda = ready(KEDA())
    for t in range(0, 300, 15):
        d = keda.decide(obs(t, 0.0))
    assert d.serving >= 1  # cooldown not over
    assert keda.decide(obs(300, 0.0)).serving == 0
    assert keda.decide(obs(330, 5.0)).serving == 1  # activation from zero


def test_fixed_fleet_sizes_for_the_peak_or_holds_the_size_it_is_given():
    peak_sized = ready(Fixed())
    assert peak_sized.size == 10  # peak 100 req/s at 10 per replica
    assert peak_sized.decide(obs(3600, 500.0)).serving == 10  # never scales
    given = Fixed(3)
    given.prepare(ctx())
    assert given.initial() == (3, 0)
    assert given.decide(obs(3600, 500.0)).serving == 3


def test_always_on_frontier_attainment_rises_with_the_fleet(data_dir):
    from preheat_lab.bench_sim import fixed_frontier

    rows = fixed_frontier(data_dir / "azure_llm_2023_code_excerpt.csv", range(1, 6, 2))
    assert [r["replicas"] for r in rows] == [1, 3, 5]
    attain = [r["slo_attainment"] for r in rows]
    cost = [r["replica_seconds"] for r in rows]
    assert attain == sorted(attain) and attain[0] < attain[-1]
    assert cost[0] < cost[1] < cost[2]
    assert fixed_frontier(data_dir / "servegen_m-mid_2days.csv", range(1, 3)) == []  # series: no frontier


def test_aibrix_trend_is_clamped_to_four_times_the_window_mean():
    spike = ready(AIBrix())
    for t in range(0, 166, 15):
        spike.decide(obs(t, 0.0))
    d = spike.decide(obs(180, 130.0))
    # 13 samples, mean 10: the line projects far above 4 x 10 = 40 at +120 s, so 40 it is
    assert d.forecast_value == pytest.approx(40.0)
    assert d.forecast_need == 4 and d.reactive_need == 13  # the floor stays under the reactive need
