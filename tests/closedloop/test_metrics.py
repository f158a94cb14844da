"""Closed-loop figures computed from recorded samples: replica-seconds, promotions, capacity lead."""

from __future__ import annotations

import numpy as np
import pytest
from preheat_lab.closedloop import PodView, Sample, endpoint_manifest
from preheat_lab.closedloop import metrics as M
from preheat_lab.closedloop.experiment import LoopConfig, decisions
from preheat_lab.loadgen import RequestRecord


def pod(uid: str, role: str, ready: bool, created: float = 0.0, deleting: bool = False,
        ready_since: float | None = None) -> PodView:
    return PodView(uid=uid, name=f"p-{uid}", role=role, ready=ready, created_s=created, deleting=deleting,
                   ready_since_s=ready_since)


def test_replica_seconds_charge_each_interval_to_the_pod_state():
    samples = [
        Sample(0.0, (pod("a", "serving", True), pod("b", "warm", False, created=0.0))),
        Sample(10.0, (pod("a", "serving", True), pod("b", "warm", True))),
        Sample(20.0, (pod("a", "serving", True), pod("b", "serving", True))),
        Sample(30.0, (pod("a", "serving", True),)),
    ]
    rs = M.replica_seconds(samples, 0.0, 30.0)
    # a: serving 30 s; b: starting 10 s, warm 10 s, serving 10 s, then gone
    assert rs["serving"] == pytest.approx(40.0)
    assert rs["warm"] == pytest.approx(10.0)
    assert rs["starting"] == pytest.approx(10.0)
    assert rs["total"] == pytest.approx(60.0)
    # a pod is charged only from its creation, and only inside the window
    late = [Sample(0.0, (pod("c", "warm", False, created=4.0),)), Sample(10.0, ())]
    assert M.replica_seconds(late, 0.0, 10.0)["starting"] == pytest.approx(6.0)
    assert M.replica_seconds(samples, 0.0, 15.0)["total"] == pytest.approx(30.0)


def test_promotion_of_a_pod_that_waited_warm_hides_a_cold_start():
    samples = [
        Sample(0.0, (pod("a", "serving", True, ready_since=-50), pod("w", "warm", True, ready_since=-20),
                     pod("n", "warm", False))),
        Sample(2.0, (pod("a", "serving", True, ready_since=-50), pod("w", "serving", True, ready_since=-20),
                     pod("n", "warm", False))),
        # n becomes Ready at 3.0 and is promoted at once: the pool was empty, the user waited
        Sample(4.0, (pod("a", "serving", True, ready_since=-50), pod("w", "serving", True, ready_since=-20),
                     pod("n", "serving", True, ready_since=3.0))),
    ]
    proms = M.promotions(samples, min_wait_s=5.0)
    assert [(p["pod"], p["hid_cold_start"]) for p in proms] == [("p-w", True), ("p-n", False)]
    assert proms[0]["waited_warm_s"] == pytest.approx(22.0)


def test_reaction_time_runs_from_a_scale_up_decision_to_that_many_serving():
    def serving(t: float, n: int) -> Sample:
        return Sample(t, tuple(pod(str(i), "serving", True) for i in range(n)))

    samples = [serving(0, 1), serving(2, 1), serving(4, 2), serving(10, 2), serving(20, 3)]
    decs = [{"t_s": 1.0, "servingFrom": 1, "servingTo": 2}, {"t_s": 5.0, "servingFrom": 2, "servingTo": 3},
            {"t_s": 21.0, "servingFrom": 3, "servingTo": 2}, {"t_s": 22.0, "servingFrom": 3, "servingTo": 5}]
    r = M.reaction_times(decs, samples)
    assert [(x["serving_to"], x["reaction_s"]) for x in r] == [(2, 3.0), (3, 15.0)]  # never-reached 5 left out


def test_capacity_lead_is_positive_when_serving_replicas_precede_the_demand():
    need_t = np.arange(0.0, 10.0)
    need = np.array([1, 1, 1, 2, 2, 2, 3, 3, 3, 3], dtype=float)
    early = [Sample(float(t), tuple(pod(str(i), "serving", True) for i in range(n)))
             for t, n in [(0, 1), (1, 2), (4, 3)]]
    late = [Sample(float(t), tuple(pod(str(i), "serving", True) for i in range(n)))
            for t, n in [(0, 1), (5, 2), (9, 3)]]
    lead_early = {x["replicas"]: x["lead_s"] for x in M.capacity_lead(early, need_t, need)}
    lead_late = {x["replicas"]: x["lead_s"] for x in M.capacity_lead(late, need_t, need)}
    assert lead_early == {2: 2.0, 3: 2.0}
    assert lead_late == {2: -2.0, 3: -3.0}
    # a warm replica counts as loaded capacity, not as serving capacity
    warm = [Sample(0.0, (pod("a", "serving", True), pod("b", "warm", True))), Sample(4.0, (pod("a", "serving", True), pod("b", "serving", True)))]
    assert M.capacity_lead(warm, need_t, need, loaded=True)[0]["lead_s"] == 3.0
    assert M.capacity_lead(warm, need_t, need)[0]["lead_s"] == -1.0
    never = M.capacity_lead([Sample(0.0, (pod("x", "serving", True),)), Sample(9.0, ())], need_t, need)
    # never reached: the lead is bounded by the end of the run and flagged
    assert [(x["lead_s"], x["reached"]) for x in never] == [(3.0 - 9.0, False), (6.0 - 9.0, False)]


def test_warm_and_unready_pods_are_not_serving_capacity():
    s = Sample(0.0, (pod("a", "serving", True), pod("b", "serving", False), pod("c", "warm", True),
                     pod("d", "serving", True, deleting=True)))
    assert (s.serving_ready, s.warm_ready, s.starting) == (1, 1, 1)


def test_need_series_is_ceiling_of_smoothed_rate_over_target():
    t = np.arange(0.0, 6.0)
    rate = np.array([3.0, 3.0, 6.0, 6.0, 9.0, 9.0])
    _, need = M.need_series(t, rate, target_per_replica=3.0, smooth_s=1.0)
    assert need.tolist() == [1, 1, 2, 2, 3, 3]
    _, smooth = M.need_series(t, rate, target_per_replica=3.0, smooth_s=2.0)
    assert smooth.tolist() == [1, 1, 2, 2, 3, 3]  # first bin averages itself only
    with pytest.raises(ValueError):
        M.need_series(t, rate, target_per_replica=0)


def test_cold_start_seconds_from_creation_to_first_ready_sample():
    samples = [Sample(0.0, (pod("a", "warm", False, created=-3.0),)), Sample(2.0, (pod("a", "warm", True, created=-3.0),))]
    assert M.cold_start_seconds(samples) == [5.0]
    # a pod that was Ready before sampling began: its Ready transition time, not the first sample
    early = [Sample(0.0, (pod("b", "warm", True, created=-80.0, ready_since=-60.0),))]
    assert M.cold_start_seconds(early) == [20.0]


def test_violations_count_misses_per_bin():
    recs = [RequestRecord(0, 0.5, 4, 4, slo_met=True), RequestRecord(1, 1.5, 4, 4), RequestRecord(2, 6.0, 4, 4)]
    t, c = M.violations_per_bin(recs, 5.0, 10.0)
    assert t.tolist() == [0.0, 5.0] and c.tolist() == [1, 1]


def test_decisions_are_deduplicated_on_the_experiment_clock():
    t0 = 1_000_000.0
    d = {"time": "1970-01-12T13:46:41Z", "from": 1, "to": 2, "servingFrom": 1, "servingTo": 2}
    decs = decisions([Sample(1.0, status={"lastDecision": d}), Sample(3.0, status={"lastDecision": d})], t0)
    assert len(decs) == 1 and decs[0]["t_s"] == pytest.approx(1.0)


def test_modes_share_the_endpoint_and_differ_in_the_operator_switch(tmp_path):
    from preheat.controller.spec import parse_spec
    from preheat_lab.closedloop.experiment import OperatorProcess

    cfg = LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://127.0.0.1:9090", out_dir=tmp_path)
    pre, rea = endpoint_manifest(cfg, "preheat"), endpoint_manifest(cfg, "reactive")
    assert pre["spec"] == rea["spec"]
    parse_spec(pre["spec"])  # the operator's own spec model accepts it
    assert "--reactive-only" in OperatorProcess(cfg, "ns", "reactive", tmp_path / "log").argv()
    assert "--reactive-only" not in OperatorProcess(cfg, "ns", "preheat", tmp_path / "log").argv()
    with pytest.raises(ValueError, match="mode"):
        endpoint_manifest(cfg, "knative")


def test_analysis_and_plot_of_a_recorded_run(tmp_path):
    """The whole report path on a recorded (synthetic) run: figures, JSON and a real PNG."""
    import json

    from preheat_lab.closedloop.experiment import Comparison, analyse
    from preheat_lab.closedloop.plot import plot_comparison
    from preheat_lab.loadgen import Arrival

    cfg = LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://127.0.0.1:9090", out_dir=tmp_path,
                     target_per_replica=1.0, interval_s=3.0, sample_interval_s=2.0)
    arrivals = [Arrival(i * 0.5, 8, 4) for i in range(20)] + [Arrival(10 + i * 0.25, 8, 4) for i in range(40)]
    records = [RequestRecord(i, a.t_s, 8, 4, sent_s=a.t_s, done_s=a.t_s + 0.2, status=200, slo_met=a.t_s < 15)
               for i, a in enumerate(arrivals)]
    samples = []
    for t in range(0, 22, 2):
        pods = [pod("a", "serving", True, created=-30, ready_since=-20)]
        pods.append(pod("w", "serving" if t >= 10 else "warm", True, created=-30, ready_since=-15))
        if t >= 6:
            pods.append(pod("n", "warm", t >= 14, created=6, ready_since=14 if t >= 14 else None))
        samples.append(Sample(float(t), tuple(pods), {"observedSignal": 2.0 if t < 10 else 4.0, "forecastSignal": 4.0,
                                                      "conditions": [{"type": "MetricsAvailable", "status": "True"}]}))
    r = analyse(cfg, records, samples, arrivals, 20.0, 0.0)
    assert r["promotions"] == 1 and r["cold_starts_hidden"] == 1
    assert r["slo"]["requests"] == 60 and r["slo_attainment"] == pytest.approx(sum(x.slo_met for x in records) / 60)
    assert r["metrics_available"] and r["max_serving"] == 2
    assert r["replica_seconds"]["total"] == pytest.approx(20 + 20 + 8 + 6)  # a, w, n starting 6→14, warm 14→20
    comp = Comparison(modes={"preheat": r, "reactive": r})
    out = json.loads(json.dumps(comp.to_json(), default=float))
    png = plot_comparison(out, tmp_path / "loop.png", cfg.target_per_replica)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serving_orders_from_events_and_decisions_with_their_reason():
    events = [
        {"t_s": 5.0, "reason": "Promoted", "message": "promoted warm pod(s) p-1 to serving (forecast: serving -> 3)"},
        {"t_s": 6.0, "reason": "ScaledUp",
         "message": "replicas 3 -> 4 (serving 3, warm pool 1): forecast: signal 2.3 (panic window 2.4) needs 2; …"},
        {"t_s": 40.0, "reason": "ScaledUp", "message": "replicas 4 -> 5 (serving 4, warm pool 1): reactive: signal …"},
        {"t_s": 41.0, "reason": "Reconciled", "message": "updated Deployment"},
    ]
    decs = [{"t_s": 39.5, "servingFrom": 3, "servingTo": 4, "reason": "reactive"},
            {"t_s": 60.0, "servingFrom": 4, "servingTo": 3, "reason": "stabilization"}]
    orders = M.serving_orders(events, decs)
    assert [(o["t_s"], o["serving_to"], o["reason"]) for o in orders] == [
        (5.0, 3, "forecast"), (6.0, 3, "forecast"), (39.5, 4, "reactive"), (40.0, 4, "reactive")]
    levels = [{"replicas": 3, "t_need_s": 50.0, "t_have_s": 8.0, "lead_s": 42.0, "reached": True},
              {"replicas": 4, "t_need_s": 45.0, "t_have_s": 70.0, "lead_s": -25.0, "reached": True}]
    rows = M.order_lead(levels, orders, [20.0, 30.0, 40.0])
    assert rows[0]["reason"] == "forecast" and rows[0]["order_lead_s"] == pytest.approx(45.0)
    assert rows[0]["cold_start_p90_s"] == pytest.approx(38.0) and rows[0]["ordered_a_cold_start_ahead"]
    assert rows[1]["reason"] == "reactive" and not rows[1]["ordered_a_cold_start_ahead"]
    summary = M.forecast_summary(rows)
    assert summary == {"levels": 2, "ordered_by_forecast": 1, "forecast_cold_start_ahead_and_ready": 1,
                       "max_forecast_order_lead_s": pytest.approx(45.0)}
