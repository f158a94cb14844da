"""The closed loop's `keda` and `aibrix` modes without a cluster: the endpoint they scale, the
ScaledObject and PodAutoscaler against the spec and Preheat's policy, the peers' Events as the run's
decisions, and the analysis, JSON, SUMMARY and plot of a run with every autoscaler."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from preheat_lab.closedloop import MODES, LoopConfig, Sample, endpoint_manifest
from preheat_lab.closedloop import aibrix as A
from preheat_lab.closedloop import hpa as H
from preheat_lab.closedloop import keda as K
from preheat_lab.closedloop import metrics as M
from preheat_lab.closedloop.experiment import (
    PEERS,
    OperatorProcess,
    _peer_record,
    aibrix_target,
    analyse,
    hpa_per_replica,
    peer_manifest,
)
from preheat_lab.loadgen import Arrival, RequestRecord

from .test_metrics import pod


def _cfg(tmp_path, **kw) -> LoopConfig:
    return LoopConfig(kubeconfig=tmp_path / "k", prometheus_url="http://127.0.0.1:9090", out_dir=tmp_path, **kw)


@pytest.mark.parametrize("mode", ["keda", "aibrix"])
def test_peer_modes_scale_hpa_modes_endpoint_in_preview_without_a_warm_pool(tmp_path, mode):
    from preheat.controller.spec import Mode, parse_spec

    cfg = _cfg(tmp_path)
    assert mode in MODES and mode in PEERS
    body = endpoint_manifest(cfg, mode)
    spec = parse_spec(body["spec"])
    assert spec.scaling.mode is Mode.preview and spec.scaling.warm_pool.max == 0
    assert body["spec"] == endpoint_manifest(cfg, "hpa")["spec"]  # the same endpoint every peer scales
    assert "--reactive-only" in OperatorProcess(cfg, "ns", mode, tmp_path / "log").argv()
    with pytest.raises(ValueError):
        peer_manifest(cfg, "preheat", "ns")


def test_keda_scaledobject_reads_preheats_rate_query_with_the_per_replica_rate_preheat_sizes_for(tmp_path):
    from preheat.controller.builders import workload_name
    from preheat.controller.observe import default_queries

    cfg = _cfg(tmp_path, target_per_replica=1.5, min_replicas=1, max_replicas=5)
    so = peer_manifest(cfg, "keda", "ns1")
    assert (so["apiVersion"], so["kind"]) == (f"{K.GROUP}/{K.VERSION}", "ScaledObject")
    assert so["metadata"]["name"] == so["spec"]["scaleTargetRef"]["name"] == workload_name(cfg.endpoint)
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 5)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    md = trigger["metadata"]
    # the very query the operator reads for this endpoint, over the same window
    assert md["query"] == default_queries("ns1", cfg.endpoint, cfg.window, cfg.panic_window)["rate"]
    assert md["serverAddress"] == cfg.prometheus_url
    # AverageValue (KEDA's default): the threshold is per replica, the hpa mode's 1200m
    assert float(md["threshold"]) == pytest.approx(hpa_per_replica(cfg)) == pytest.approx(1.2)
    assert "metricType" not in trigger
    # KEDA's defaults: 30 s pollingInterval, 300 s cooldownPeriod, the HPA's behavior
    assert not {"pollingInterval", "cooldownPeriod", "advanced", "fallback"} & set(so["spec"])
    assert K.hpa_name(so["metadata"]["name"]) == f"keda-hpa-{workload_name(cfg.endpoint)}"
    with pytest.raises(ValueError):
        K.threshold(0.0)


def test_aibrix_podautoscaler_is_kpa_on_running_requests_at_the_same_capacity_by_littles_law(tmp_path):
    from preheat.controller.builders import workload_name
    from preheat.controller.spec import parse_spec

    cfg = _cfg(tmp_path, target_per_replica=1.5, min_replicas=1, max_replicas=5)
    pa = peer_manifest(cfg, "aibrix", "ns1", request_s=0.25)
    assert (pa["apiVersion"], pa["kind"]) == (f"{A.GROUP}/{A.VERSION}", A.KIND)
    spec = pa["spec"]
    assert spec["scalingStrategy"] == "KPA"
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload_name(cfg.endpoint)}
    assert pa["metadata"]["name"] == workload_name(cfg.endpoint)  # AIBrix's docs: the same name
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 5)
    (src,) = spec["metricsSources"]
    assert src["metricSourceType"] == "pod" and src["targetMetric"] == A.METRIC
    assert int(src["port"]) == parse_spec(endpoint_manifest(cfg, "aibrix")["spec"]).server.port
    # 1.2 req/s per replica x 0.25 s in the replica = 0.3 requests running per replica
    assert float(src["targetValue"]) == pytest.approx(0.3)
    assert not pa["metadata"].get("annotations")  # AIBrix's defaults (windows, tolerances, cooldowns)
    # KPA: desired = ceil(sum of running over pods / target). At a steady rate that is
    # ceil(rate x request_s / (per_replica x request_s)): the replicas the rate needs at 1.2 per replica.
    for rate in (0.9, 1.3, 2.5, 4.7):
        running = rate * 0.25
        assert math.ceil(running / float(src["targetValue"]) - 1e-9) == math.ceil(rate / 1.2 - 1e-9)
    with pytest.raises(ValueError):
        A.running_target(1.2, 0.0)


def test_aibrix_request_time_is_the_load_tested_default_or_configured_and_the_runs_own_is_recorded(tmp_path):
    earlier = [{"request_s_mean": 0.1, "request_s_count": 300}, {"request_s_mean": 0.3, "request_s_count": 100},
               {"request_s_mean": None, "request_s_count": 0}]
    assert A.request_seconds(earlier) == (pytest.approx(0.15), 400)
    assert A.request_seconds([]) is None
    t = aibrix_target(_cfg(tmp_path), earlier)
    assert t["request_s"] == A.DEFAULT_REQUEST_S and "load-tested" in t["request_s_source"]
    assert t["running_per_replica"] == pytest.approx(1.2 * A.DEFAULT_REQUEST_S)
    assert (t["earlier_modes_request_s"], t["earlier_modes_requests"]) == (pytest.approx(0.15), 400)
    c = aibrix_target(_cfg(tmp_path, aibrix_request_s=0.5), earlier)
    assert c["request_s"] == 0.5 and c["running_per_replica"] == pytest.approx(0.6)
    assert aibrix_target(_cfg(tmp_path), [])["earlier_modes_request_s"] is None
    # paced replicas (the closed loop's --replica-rps): an answer takes its tokens x the step floor
    p = aibrix_target(_cfg(tmp_path, min_step_ms=166.0, mean_output_tokens=6.0), earlier)
    assert p["request_s"] == pytest.approx(0.996) and "step floor" in p["request_s_source"]
    assert aibrix_target(_cfg(tmp_path, min_step_ms=166.0, mean_output_tokens=6.0, aibrix_request_s=1.12),
                         earlier)["request_s"] == 1.12  # a configured load test still wins


class _Event(SimpleNamespace):
    pass


class _Core:
    """list_namespaced_event as the API answers it, filtered by the field selector it is asked with."""

    def __init__(self, events: list[tuple[str, str, str, float, str, int]]):
        self.events = events
        self.selectors: list[str] = []

    def list_namespaced_event(self, namespace, field_selector):
        import datetime as dt

        self.selectors.append(field_selector)
        want = dict(kv.split("=") for kv in field_selector.split(","))
        items = [_Event(reason=r, message=m, count=c, event_time=None, last_timestamp=None,
                        first_timestamp=dt.datetime.fromtimestamp(t, dt.UTC))
                 for kind, name, r, t, m, c in self.events
                 if (kind, name) == (want["involvedObject.kind"], want["involvedObject.name"])]
        return SimpleNamespace(items=items)


def test_keda_decisions_are_its_hpas_rescales_and_aibrix_decisions_its_podautoscalers(monkeypatch):
    monkeypatch.setattr(H, "read_status", lambda api, ns, name: {"hpa": name})
    monkeypatch.setattr(K, "read_status", lambda api, ns, name: {"so": name})
    monkeypatch.setattr(A, "read_status", lambda api, ns, name: {"pa": name})
    t0 = 1_000_000.0
    core = _Core([
        ("HorizontalPodAutoscaler", "keda-hpa-tiny", "SuccessfulRescale",
         t0 + 31, "New size: 2; reason: external metric s0-prometheus(...) above target", 1),
        ("HorizontalPodAutoscaler", "keda-hpa-tiny", "SuccessfulRescale",
         t0 + 76, "New size: 4; reason: external metric s0-prometheus(...) above target", 1),
        ("PodAutoscaler", "tiny", "AlgorithmRun", t0 + 9, "KPA algorithm completed. currentReplicas: 1, "
         "desiredReplicas: 3, shouldScale: true", 1),
        ("PodAutoscaler", "tiny", "SuccessfulRescale", t0 + 9, "New size: 3; reason: panic mode scaling", 1),
        ("HorizontalPodAutoscaler", "tiny", "SuccessfulRescale", t0 + 5, "New size: 5; reason: not this one", 1),
    ])
    events, status, decs = _peer_record(None, core, "keda", "ns", "tiny", t0, 1)
    assert [(d["t_s"], d["servingFrom"], d["servingTo"], d["reason"]) for d in decs] == \
        [(31.0, 1, 2, "keda"), (76.0, 2, 4, "keda")]
    assert status == {"scaledObject": {"so": "tiny"}, "hpa": {"hpa": "keda-hpa-tiny"}}
    events, status, decs = _peer_record(None, core, "aibrix", "ns", "tiny", t0, 1)
    assert [(d["t_s"], d["servingTo"], d["reason"], d["detail"]) for d in decs] == \
        [(9.0, 3, "aibrix", "panic mode scaling")]
    assert {e["reason"] for e in events} == {"AlgorithmRun", "SuccessfulRescale"} and status == {"pa": "tiny"}
    assert "involvedObject.kind=PodAutoscaler,involvedObject.name=tiny" in core.selectors


def test_requests_that_waited_on_a_cold_start():
    need_t = np.arange(0.0, 20.0, 1.0)
    need = np.where(need_t >= 6, 2.0, 1.0)
    samples = [Sample(float(t), tuple([pod("a", "serving", True, created=-30)]
                                      + ([pod("b", "warm", t >= 14, created=5)] if t >= 6 else [])))
               for t in range(0, 20, 2)]
    recs = [RequestRecord(i, t, 8, 4, slo_met=(t < 9 or t >= 14)) for i, t in enumerate([1.0, 7.0, 9.5, 13.0, 15.0])]
    # 7, 9.5, 13: two replicas needed, one serving, one starting; at 1 s one sufficed; at 15 s both Ready
    assert M.cold_start_waits(recs, samples, need_t, need) == {"requests": 3, "missed_slo": 2}
    # a warm pool covering the need hides it
    warm = [Sample(s.t_s, (pod("a", "serving", True, created=-30), pod("w", "serving", True, created=-30)))
            for s in samples]
    assert M.cold_start_waits(recs, warm, need_t, need) == {"requests": 0, "missed_slo": 0}


def test_a_run_with_every_autoscaler_is_analysed_reported_and_plotted_one_panel_each(tmp_path):
    from preheat_lab.closedloop.__main__ import build_parser, summary_line
    from preheat_lab.closedloop.experiment import Comparison
    from preheat_lab.closedloop.plot import plot_comparison

    cfg = _cfg(tmp_path, target_per_replica=1.0)
    arrivals = [Arrival(i * 0.5, 8, 4) for i in range(40)]
    # streamed: the first token 1.5 s after the scheduled time for the first ten, 0.1 s after for the rest
    records = [RequestRecord(i, a.t_s, 8, 4, sent_s=a.t_s, done_s=a.t_s + 0.2, status=200, slo_met=a.t_s < 8,
                             first_token_s=a.t_s + (1.5 if i < 10 else 0.1))
               for i, a in enumerate(arrivals)]
    samples = [Sample(float(t), tuple([pod("a", "serving", True, created=-30, ready_since=-20)]
                                      + ([pod("n", "serving", t >= 14, created=5, ready_since=14 if t >= 14 else None)]
                                         if t >= 6 else [])))
               for t in range(0, 22, 2)]
    runs = {}
    for mode in MODES:
        scaler = None
        if mode in PEERS:
            scaler = H.rescale_decisions([{"t_s": 4.0, "reason": "SuccessfulRescale",
                                           "message": "New size: 2; reason: above target"}], 1, reason=mode)
        runs[mode] = analyse(cfg, records, samples, arrivals, 20.0, 0.0, (), scaler)
    for mode in ("keda", "aibrix"):
        r = runs[mode]
        assert [(o["t_s"], o["serving_to"], o["reason"]) for o in r["serving_orders"]] == [(4.0, 2, mode)]
        assert r["scale_actions"] == 1 and r["pods_started"] == 1
        assert r["request_s_mean"] == pytest.approx(0.2) and r["request_s_count"] == 40
        assert r["cold_start_waits"]["requests"] > 0
    comp = Comparison(modes=runs)
    out = json.loads(json.dumps(comp.to_json(), default=float))
    assert out["schedule"] == "back-to-back"
    assert list(out["headline"]) == list(MODES)
    assert out["headline"]["aibrix"]["cold_start_waits"] == runs["aibrix"]["cold_start_waits"]["requests"]
    assert out["headline"]["keda"]["ttft_slo_attainment"] == pytest.approx(30 / 40)  # 1 s TTFT SLO
    line = summary_line(out["headline"])
    assert "keda: SLO 40.0% (TTFT 75.0%)" in line and "aibrix: SLO" in line and "waited on a cold start" in line
    png = plot_comparison(out, tmp_path / "loop.png", cfg.target_per_replica)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the issue's spelling of the flag
    args = build_parser().parse_args(["--autoscalers", "preheat,hpa,keda,aibrix,reactive"])
    assert args.modes == "preheat,hpa,keda,aibrix,reactive"


def test_cli_refuses_an_unknown_mode_and_names_the_build_of_a_missing_peer(tmp_path, capsys):
    from preheat_lab.closedloop.__main__ import _missing_peers, main

    assert main(["--autoscalers", "preheat,knative"]) == 2
    assert "subset of" in capsys.readouterr().err
    cluster = SimpleNamespace(bin_dir=tmp_path)
    assert "build-peers.sh keda" in _missing_peers(cluster, ["preheat", "keda"])
    assert "build-peers.sh aibrix" in _missing_peers(cluster, ["aibrix"])
    for name in ("keda-operator", "keda-adapter", "aibrix-controllers"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert _missing_peers(cluster, ["preheat", "reactive", "keda", "aibrix"]) is None
