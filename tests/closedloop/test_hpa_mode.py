"""The closed loop's `hpa` mode without a cluster: the endpoint the HPA scales, the HPA itself, what the
adapter must expose for it, and how the HPA's rescale Events become the run's decisions and figures."""

from __future__ import annotations

import json
import re

import pytest
from preheat_lab.closedloop import MODES, LoopConfig, Sample, endpoint_manifest
from preheat_lab.closedloop import hpa as H
from preheat_lab.closedloop.experiment import OperatorProcess, analyse, hpa_manifest, scale_actions
from preheat_lab.loadgen import Arrival, RequestRecord

from .test_metrics import pod


def _cfg(tmp_path, **kw) -> LoopConfig:
    return LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://127.0.0.1:9090", out_dir=tmp_path, **kw)


def test_hpa_mode_endpoint_is_preheats_in_preview_without_a_warm_pool(tmp_path):
    from preheat.controller.builders import initial_replicas
    from preheat.controller.spec import Mode, parse_spec

    cfg = _cfg(tmp_path)
    assert "hpa" in MODES
    pre, hpa = endpoint_manifest(cfg, "preheat"), endpoint_manifest(cfg, "hpa")
    spec = parse_spec(hpa["spec"])  # the operator's own model (and so the CRD's schema) accepts it
    # Preview: the operator creates the Deployment, Service and PDB and writes status, never replicas
    assert spec.scaling.mode is Mode.preview
    assert spec.scaling.warm_pool.min == spec.scaling.warm_pool.max == 0
    assert initial_replicas(spec) == cfg.min_replicas  # the HPA starts from the endpoint's minimum
    # everything else is the other modes' endpoint
    rest = {k: v for k, v in hpa["spec"]["scaling"].items() if k not in ("mode", "warmPool")}
    assert rest == {k: v for k, v in pre["spec"]["scaling"].items() if k != "warmPool"}
    assert {k: v for k, v in hpa["spec"].items() if k != "scaling"} == \
        {k: v for k, v in pre["spec"].items() if k != "scaling"}
    # the operator does not forecast for it either (nothing to draw, nothing it could apply)
    assert "--reactive-only" in OperatorProcess(cfg, "ns", "hpa", tmp_path / "log").argv()


def test_hpa_targets_the_endpoints_deployment_with_its_per_replica_target_and_bounds(tmp_path):
    from kubernetes.utils.quantity import parse_quantity
    from preheat.controller.builders import workload_name
    from preheat.controller.spec import parse_spec
    from preheat.scaling.from_spec import policy_config

    cfg = _cfg(tmp_path, target_per_replica=1.5, min_replicas=1, max_replicas=5)
    full = parse_spec(endpoint_manifest(cfg, "preheat")["spec"])
    spec = parse_spec(endpoint_manifest(cfg, "hpa")["spec"]).scaling
    h = hpa_manifest(cfg)
    assert h["apiVersion"] == "autoscaling/v2" and h["kind"] == "HorizontalPodAutoscaler"
    ref = h["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", workload_name(cfg.endpoint))
    assert (h["spec"]["minReplicas"], h["spec"]["maxReplicas"]) == (spec.min_replicas, spec.max_replicas)
    (metric,) = h["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == H.METRIC
    target = metric["pods"]["target"]
    assert target["type"] == "AverageValue"
    # the rate per replica Preheat's policy sizes for: targetPerReplica at its target utilization
    per_replica = policy_config(full).capacity_per_replica
    assert per_replica == pytest.approx(spec.target_per_replica * policy_config(full).target_utilization)
    assert float(parse_quantity(target["averageValue"])) == pytest.approx(per_replica)
    assert target["averageValue"] == "1200m"  # 1.5 req/s at 0.8
    assert "behavior" not in h["spec"]  # the HPA's defaults: 15 s sync, 300 s scale-down stabilization


def test_the_metric_is_the_name_the_adapter_rules_expose_for_preheats_counter():
    rules = H.adapter_rules("20s")
    (rule,) = rules["rules"]
    assert rule["seriesQuery"].startswith(H.SERIES + "{")
    # the adapter's rename is a Go regexp replacement: ${1} is the first group
    renamed = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), H.SERIES)
    assert renamed == H.METRIC
    assert "[20s]" in rule["metricsQuery"]
    assert LoopConfig(kubeconfig="k", prometheus_url="p", out_dir="o").hpa_rules() == H.adapter_rules("20s")
    assert LoopConfig(kubeconfig="k", prometheus_url="p", out_dir="o", hpa_rate_window="2m").hpa_rules() == \
        H.adapter_rules("2m")


@pytest.mark.parametrize(("value", "q"), [(1.5, "1500m"), (2.0, "2"), (0.25, "250m"), (1.234, "1234m")])
def test_quantity(value, q):
    assert H.quantity(value) == q


def test_quantity_refuses_a_zero_target():
    with pytest.raises(ValueError):
        H.quantity(0.0)


def test_rescale_events_become_decisions_in_order():
    events = [
        {"t_s": 40.0, "reason": "SuccessfulRescale",
         "message": "New size: 4; reason: pods metric preheat:requests_received_per_second above target", "count": 1},
        {"t_s": 10.0, "reason": "SuccessfulRescale",
         "message": "New size: 2; reason: pods metric preheat:requests_received_per_second above target", "count": 2},
        {"t_s": 12.0, "reason": "FailedGetPodsMetric", "message": "unable to get metric ..."},
        {"t_s": 90.0, "reason": "SuccessfulRescale", "message": "New size: 3; reason: All metrics below target"},
    ]
    d = H.rescale_decisions(events, start_replicas=1)
    assert [(x["t_s"], x["servingFrom"], x["servingTo"]) for x in d] == [(10.0, 1, 2), (40.0, 2, 4), (90.0, 4, 3)]
    assert {x["reason"] for x in d} == {"hpa"}
    assert d[2]["detail"] == "All metrics below target"
    assert scale_actions([], d) == 4  # the repeated Event counts twice
    assert scale_actions([{"reason": "ScaledUp"}, {"reason": "Promoted"}, {"reason": "ScaledDown"}]) == 2


def test_hpa_run_is_analysed_on_the_hpas_decisions_and_plotted_in_its_own_panel(tmp_path):
    from preheat_lab.closedloop.__main__ import summary_line
    from preheat_lab.closedloop.experiment import Comparison
    from preheat_lab.closedloop.plot import plot_comparison

    cfg = _cfg(tmp_path, target_per_replica=1.0)
    arrivals = [Arrival(i * 0.5, 8, 4) for i in range(40)]
    records = [RequestRecord(i, a.t_s, 8, 4, sent_s=a.t_s, done_s=a.t_s + 0.2, status=200, slo_met=True)
               for i, a in enumerate(arrivals)]
    samples = []
    for t in range(0, 22, 2):
        pods = [pod("a", "serving", True, created=-30, ready_since=-20)]
        if t >= 6:  # the HPA's second replica: a cold start, promoted by the operator as soon as Ready
            pods.append(pod("n", "serving" if t >= 16 else "warm", t >= 14, created=5,
                            ready_since=14 if t >= 14 else None))
        # the operator's preview decision must not count: the HPA scaled
        samples.append(Sample(float(t), tuple(pods), {"lastDecision": {"time": None, "servingFrom": 1, "servingTo": 3,
                                                                       "reason": "reactive"}}))
    events = [{"t_s": 4.0, "reason": "SuccessfulRescale", "message": "New size: 2; reason: pods metric x above target"}]
    # the operator's own Events (Preview: it relabels Ready pods) are not orders in hpa mode
    op_events = [{"t_s": 16.0, "reason": "Promoted", "message": "promoted warm pod(s) p-n to serving (reactive: serving -> 2)"}]
    r = analyse(cfg, records, samples, arrivals, 20.0, 0.0, op_events, H.rescale_decisions(events, 1))
    assert [(o["t_s"], o["serving_to"], o["reason"]) for o in r["serving_orders"]] == [(4.0, 2, "hpa")]
    assert r["decisions"][0]["reason"] == "hpa" and r["scale_actions"] == 1
    assert r["scale_ups"] == [{"t_s": 4.0, "serving_from": 1, "serving_to": 2, "reaction_s": 12.0}]
    assert r["pods_started"] == 1 and r["promotions"] == 1 and r["cold_starts_hidden"] == 0
    comp = Comparison(modes={"preheat": r, "reactive": r, "hpa": r})
    out = json.loads(json.dumps(comp.to_json(), default=float))
    assert set(out["headline"]) == {"preheat", "reactive", "hpa"}
    assert out["headline"]["hpa"]["scale_actions"] == 1 and out["headline"]["hpa"]["pods_started"] == 1
    line = summary_line(out["headline"])
    assert "hpa: SLO 100.0%" in line and "1 scale actions" in line
    png = plot_comparison(out, tmp_path / "loop.png", cfg.target_per_replica)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
