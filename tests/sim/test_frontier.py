"""`preheat frontier` and `preheat simulate --spec`: the sweep's shape and rules, and the one spec."""

from __future__ import annotations

import json

import numpy as np
import pytest
from preheat.cli import main as preheat_main
from preheat.sim.frontier import (
    SLO_TARGETS,
    UTILIZATIONS,
    cheapest_point,
    cost_at_slo,
    deploy_text,
    fixed_sizes,
    setting_text,
    sweep,
)
from preheat.sim.run import SimSettings, prepare_workload
from preheat.sim.traces import load_cold_start, load_trace

from .tracegen import write_series

# A day at 10-minute windows: a morning ramp and an evening fall.
RATES = [100 + 80 * np.sin(2 * np.pi * (h / 6 - 6) / 24) for h in range(144)]


def test_cost_at_slo_is_the_cheapest_point_that_reaches_the_target():
    points = [{"slo_attainment": 0.995, "replica_seconds": 300.0}, {"slo_attainment": 0.9991, "replica_seconds": 500.0},
              {"slo_attainment": 0.98, "replica_seconds": 100.0}, {"slo_attainment": 1.0, "replica_seconds": 400.0}]
    assert cost_at_slo(points, (0.99, 0.999, 0.9999)) == {"0.99": 300.0, "0.999": 400.0, "0.9999": 400.0}
    assert cost_at_slo(points[2:3], (0.99,)) == {"0.99": None}


def test_each_cheapest_point_is_printed_with_the_setting_to_deploy():
    points = [{"target_utilization": 0.5, "slo_attainment": 0.9995, "replica_seconds": 500.0},
              {"target_utilization": 0.8, "slo_attainment": 0.992, "replica_seconds": 300.0},
              {"target_utilization": 1.0, "slo_attainment": 0.97, "replica_seconds": 250.0}]
    assert cheapest_point(points, 0.99) is points[1] and cheapest_point(points, 0.9999) is None
    assert setting_text(points[1]) == "U 0.8"
    assert setting_text({"replicas": 12, "target_utilization": None}) == "12 replicas"
    assert setting_text({"target_utilization": 1.05, "signal_window_s": 15.0}) == "U 1.05, 15 s window"
    assert deploy_text(points, (0.99, 0.999, 0.9999), 3.037) == [
        "  at 99 %: scaling.targetPerReplica: 3.037, scaling.targetUtilization: 0.8",
        "  at 99.9 %: scaling.targetPerReplica: 3.037, scaling.targetUtilization: 0.5"]


def test_fixed_fleet_sweeps_from_one_to_one_and_a_half_times_the_peak_need(tmp_path):
    w = prepare_workload(load_trace(write_series(tmp_path / "d.csv", RATES)), SimSettings(capacity_rps=20.0))
    sizes = fixed_sizes(w)
    peak_need = int(np.ceil(max(RATES) / 20.0))
    assert sizes[0] == 1 and sizes[-1] == int(np.ceil(1.5 * peak_need)) and sizes == sorted(set(sizes))


def test_frontier_writes_every_policy_points_cost_and_a_png(tmp_path, capsys):
    trace = write_series(tmp_path / "d.csv", RATES)
    out, png = tmp_path / "f.json", tmp_path / "f.png"
    rc = preheat_main(["frontier", "--trace", str(trace), "--policy", "preheat,hpa,fixed,oracle",
                       "--utilizations", "0.5,0.9", "--cold-start", "60", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"preheat", "hpa", "fixed", "oracle"} and "machine" in doc
    hpa = doc["policies"]["hpa"]["points"]
    assert [p["target_utilization"] for p in hpa] == [0.5, 0.9]
    # more headroom costs more: the sweep moves the target, not the fleet
    assert hpa[0]["replica_seconds"] > hpa[1]["replica_seconds"]
    for p in doc["policies"].values():
        assert set(p["cost_at_slo"]) == {"0.99", "0.999"}
        ok = [x["replica_seconds"] for x in p["points"] if x["slo_attainment"] >= 0.99]
        assert p["cost_at_slo"]["0.99"] == (min(ok) if ok else None)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the verdict: Preheat against the cheapest of the baselines that reach each target (not the oracle)
    printed = capsys.readouterr().out
    for target, row in doc["verdict"].items():
        costs = {n: doc["policies"][n]["cost_at_slo"][target] for n in ("hpa", "fixed")}
        reached = {n: c for n, c in costs.items() if c is not None}
        assert row["best_baseline"] == (min(reached, key=reached.get) if reached else None)
        pre = doc["policies"]["preheat"]["cost_at_slo"][target]
        if reached and pre is not None:
            assert row["margin_vs_best"] == pytest.approx(1 - pre / reached[row["best_baseline"]])
        assert f"at {100 * float(target):g} %: Preheat" in printed
    assert "sweep a finer grid: --utilizations 0.3,0.35" in printed  # the estimate says what measures it
    lines = {line.split()[0]: line for line in printed.splitlines() if line.startswith("  ") and line.split()}
    for name, p in doc["policies"].items():  # each cheapest point printed with its setting
        best = cheapest_point(p["points"], 0.99)
        if best is not None:
            assert f"0.99: {best['replica_seconds'] / 3600:.1f} h ({setting_text(best)})" in lines[name]


def test_the_verdict_compares_preheat_with_the_cheapest_baseline_and_the_oracle():
    from preheat.sim.verdict import compare, summary

    def policy(c99, c999, points=()):
        return {"points": list(points), "cost_at_slo": {"0.99": c99, "0.999": c999}}

    pts = [{"slo_attainment": 0.985, "replica_seconds": 80.0}, {"slo_attainment": 0.995, "replica_seconds": 100.0}]
    v = compare({"preheat": policy(100.0, None, pts), "kpa": policy(125.0, None, [{"slo_attainment": 0.995,
                 "replica_seconds": 125.0}]), "hpa": policy(None, None), "oracle": policy(50.0, 80.0, [
                 {"slo_attainment": a, "replica_seconds": c} for a, c in ((0.98, 40.0), (0.99, 50.0), (0.999, 80.0))])})
    assert v["0.99"]["best_baseline"] == "kpa" and v["0.99"]["margin_vs_best"] == pytest.approx(0.2)
    assert v["0.99"]["preheat_vs_oracle"] == pytest.approx(2.0) and v["0.99"]["preheat_lowest"] is True
    assert v["0.99"]["interpolated"]["cost"]["preheat"] == pytest.approx(90.0)  # halfway between its points
    # the ratio to the oracle between grid points too: Preheat's curve (90) over the oracle's (50)
    assert v["0.99"]["interpolated"]["preheat_vs_oracle"] == pytest.approx(1.8)
    assert v["0.999"]["interpolated"]["preheat_vs_oracle"] is None  # Preheat does not reach 99.9 %
    assert v["0.999"]["best_baseline"] is None and v["0.999"]["margin_vs_best"] is None
    lines = summary(v)
    assert "20.0 % below kpa" in lines[0] and "2.00x the oracle (1.80x between grid points)" in lines[0]
    assert lines[1].endswith("Preheat does not reach it; no baseline reaches it")


def test_frontier_jobs_sweep_policies_in_parallel_with_the_same_points(tmp_path, capsys):
    trace = write_series(tmp_path / "d.csv", RATES)
    docs = []
    for jobs in ("1", "3"):
        out = tmp_path / f"f{jobs}.json"
        assert preheat_main(["frontier", "--trace", str(trace), "--policy", "preheat,kpa,fixed", "--jobs", jobs,
                             "--utilizations", "0.5,0.9", "--cold-start", "60", "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    one, three = docs
    assert three["jobs"] == 3 and list(three["policies"]) == ["preheat", "kpa", "fixed"]
    for name in one["policies"]:
        assert three["policies"][name]["points"] == one["policies"][name]["points"]
        assert three["policies"][name]["cost_at_slo"] == one["policies"][name]["cost_at_slo"]
    assert three["cpu_s"] == pytest.approx(sum(p["cpu_s"] for p in three["policies"].values()))
    assert preheat_main(["frontier", "--trace", str(trace), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0,0.5", "1.2", "x"])
def test_frontier_rejects_bad_utilizations(tmp_path, capsys, bad):
    trace = write_series(tmp_path / "d.csv", RATES[:12])
    assert preheat_main(["frontier", "--trace", str(trace), f"--utilizations={bad}"]) == 2
    assert "--utilizations" in capsys.readouterr().err


def test_simulate_runs_the_spec_it_is_given_and_rejects_a_bad_one(tmp_path, capsys):
    trace = write_series(tmp_path / "d.csv", RATES[:36])
    spec = tmp_path / "ep.yaml"
    spec.write_text("apiVersion: preheat.dev/v1alpha1\nkind: InferenceEndpoint\nmetadata: {name: x}\n"
                    "spec:\n  model: {builtin: tiny}\n  scaling:\n    warmPool: {min: 2, max: 3}\n")
    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(trace), "--policy", "preheat", "--cold-start", "60", "--json", str(out)]
    assert preheat_main([*args, "--spec", str(spec)]) == 0
    with_pool = json.loads(out.read_text())["policies"]["preheat"]
    assert preheat_main(args) == 0
    default = json.loads(out.read_text())["policies"]["preheat"]
    # warmPool.min 2 from the spec: the warm pool is paid for; the CRD's default (min 0) keeps none idle
    assert with_pool["replica_seconds_by_state"]["warm"] > 1.9 * 6 * 3600
    assert default["replica_seconds_by_state"]["warm"] < with_pool["replica_seconds_by_state"]["warm"] / 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  model: {builtin: tiny}\n  scaling: {minReplicas: 5, maxReplicas: 2}\n")
    assert preheat_main([*args, "--spec", str(bad)]) == 2
    assert "minReplicas must be <= scaling.maxReplicas" in capsys.readouterr().err


def test_simulate_aims_at_the_spec_target_utilization_unless_the_flag_says_otherwise(tmp_path):
    """`--spec` simulates the endpoint as the operator runs it: its scaling.targetUtilization is what every
    policy aims at; an explicit --target-utilization still wins; without either, Knative's 0.7."""
    trace = write_series(tmp_path / "d.csv", RATES[:12])
    spec = tmp_path / "ep.yaml"
    spec.write_text("spec:\n  model: {builtin: tiny}\n  scaling: {targetUtilization: 0.9}\n")
    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(trace), "--policy", "preheat,hpa", "--cold-start", "60", "--json", str(out)]
    aims, cost = {}, {}
    for extra in (["--spec", str(spec)], ["--spec", str(spec), "--target-utilization", "0.5"], []):
        assert preheat_main([*args, *extra]) == 0
        doc = json.loads(out.read_text())
        aims[len(extra)] = doc["target_utilization"]
        cost[len(extra)] = doc["policies"]["hpa"]["replica_seconds"]
        if extra:
            assert doc["spec"] == str(spec)
    assert aims == {2: 0.9, 4: 0.5, 0: 0.7}
    assert cost[2] < cost[0] < cost[4]  # the policies ran at that aim: more headroom costs more


def test_simulate_reads_the_signal_over_the_spec_rate_windows(tmp_path):
    """The simulated operator queries rate() over its spec's prometheus.window, as the real one does: a
    step in demand shows in full one minute after it with "1m" and five minutes after it with "5m" (the
    panic window is never shorter than two scrapes)."""
    from preheat.controller.spec import parse_spec
    from preheat.sim.preheat_policy import PreheatPolicy
    from preheat.sim.run import simulate

    w = prepare_workload(load_trace(write_series(tmp_path / "s.csv", [100.0] * 6 + [300.0] * 6)),
                         SimSettings(capacity_rps=50.0))
    full_s = 3900.0  # the fluid model ramps between window centres: 300 req/s from the 7th one on

    def full_step_seen(window: str) -> tuple[float, PreheatPolicy]:
        spec = parse_spec({"model": {"builtin": "tiny"}, "prometheus": {"window": window}})
        policy = PreheatPolicy(w, load_cold_start("60"), spec=spec)
        seen: list[tuple[float, float]] = []
        decide = policy.decide
        policy.decide = lambda obs: (seen.append((obs.time_s, obs.value)), decide(obs))[1]  # type: ignore[method-assign]
        simulate(w, policy, load_cold_start("60"), SimSettings(capacity_rps=50.0))
        return next(t for t, v in seen if v is not None and v >= 299.0), policy

    one, p1 = full_step_seen("1m")
    five, p5 = full_step_seen("5m")
    assert (p1.metrics.window_s, p5.metrics.window_s) == (60.0, 300.0)
    assert p1.metrics.panic_window_s == 30.0  # the default 20 s panic window: two 15 s scrapes
    # (a scrape reads the window that ended up to 15 s before it, and 299 of 300 is seen a little early)
    assert full_s + 30.0 <= one < full_s + 120.0
    assert full_s + 270.0 <= five < full_s + 360.0


def test_interpolated_cost_reads_the_curve_between_grid_points():
    from preheat.sim.verdict import interpolated_cost

    points = [{"slo_attainment": 0.98, "replica_seconds": 100.0}, {"slo_attainment": 1.0, "replica_seconds": 200.0}]
    assert interpolated_cost(points, 0.99) == pytest.approx(150.0)  # halfway up the segment
    assert interpolated_cost(points, 1.0) == pytest.approx(200.0)
    assert interpolated_cost(points[:1], 0.99) is None


def _sweep_all(path, settings: SimSettings, cold: str) -> dict:
    from preheat.sim.frontier import sweep
    from preheat.sim.run import POLICY_NAMES
    from preheat.sim.traces import load_cold_start

    w = prepare_workload(load_trace(path), settings)
    return sweep(w, load_cold_start(cold), settings, list(POLICY_NAMES), (0.6, 0.8, 1.0), (0.99, 0.999))


def _flat_requests(tmp_path):
    """An hour of flat Poisson arrivals with long decodes: the shape on which the oracle used to lose
    (it sized on a 310 s peak-hold of a noisy 10 s rate, above what a steady fleet needs)."""
    from .tracegen import write_requests

    rng = np.random.default_rng(3)
    times = np.sort(rng.random(rng.poisson(3600 * 3.0)) * 3600)
    return write_requests(tmp_path / "flat.csv", times, inp=800, out=300)


# Half of each day without a request, on a series quiet enough that its zeros are idle hours, not
# logging gaps: KEDA and KPA scale to zero there (an oracle that kept one replica cost 1.5x KPA).
IDLE_RATES = [0.0 if (h // 6) % 24 < 12 else 0.1 + 0.05 * np.sin(2 * np.pi * (h / 6) / 24) for h in range(144)]


@pytest.mark.parametrize("case", ["day-series-300s", "flat-requests-300s", "idle-series-30s"])
def test_oracle_costs_no_more_than_any_causal_policy_at_each_slo(tmp_path, case):
    if case.startswith("day"):
        path, settings = write_series(tmp_path / "d.csv", RATES), SimSettings(capacity_rps=20.0)
    elif case.startswith("idle"):
        path, settings = write_series(tmp_path / "i.csv", IDLE_RATES), SimSettings(capacity_rps=0.05)
    else:
        path, settings = _flat_requests(tmp_path), SimSettings(slots=3)
    res = _sweep_all(path, settings, case.rsplit("-", 1)[1].removesuffix("s"))
    for target in ("0.99", "0.999"):
        oracle = res["oracle"]["cost_at_slo"][target]
        reached = {n: p["cost_at_slo"][target] for n, p in res.items()
                   if n != "oracle" and p["cost_at_slo"][target] is not None}
        assert reached, "some causal policy must reach the SLO for the comparison to mean anything"
        assert oracle is not None
        for name, cost in reached.items():
            # 1 %: the oracle's U grid (0.05) rounds its frontier up; on the noiseless day the cliff
            # between its U = 1 (100 %) and 1.05 (71 %) leaves it 0.5 % above KPA at U = 1
            assert oracle <= 1.01 * cost, (target, name, oracle, cost)


@pytest.mark.parametrize("excerpt", ["mooncake_conversation_excerpt.jsonl", "azure_llm_2023_code_excerpt.csv"])
def test_oracle_reaches_an_slo_wherever_the_fixed_fleet_does_at_a_300s_cold_start(data_dir, excerpt):
    # On a trace shorter than one cold start only the starting fleet ever serves: the oracle, which
    # knows the first window, must start with what it needs (it started with the causal policies'
    # first-minutes fleet and reached no SLO on the azure excerpt, where a fixed fleet reaches 99.9 %).
    s = SimSettings()
    w = prepare_workload(load_trace(str(data_dir / excerpt)), s)
    res = sweep(w, load_cold_start("300"), s, ["oracle", "fixed"], UTILIZATIONS, SLO_TARGETS)
    for target in (f"{t:g}" for t in SLO_TARGETS):
        if res["fixed"]["cost_at_slo"][target] is not None:
            assert res["oracle"]["cost_at_slo"][target] is not None, (excerpt, target)


def test_repeat_days_shifts_each_copy_by_a_day_and_rejects_what_is_not_one_day(tmp_path):
    from preheat_lab.repeat_days import DAY_S, repeat_days

    src = tmp_path / "day.csv"
    src.write_text("t_s,total_rate_rps,rate_weighted_cv\n0,2.5,1.5\n43200,4.0,2.0\n", encoding="utf-8")
    dst = tmp_path / "week.csv"
    assert repeat_days(src, dst, 3) == 6
    assert repeat_days(src, tmp_path / "fortnight.csv", 14) == 28  # plain seconds, never 1.2e+06
    assert (tmp_path / "fortnight.csv").read_text(encoding="utf-8").splitlines()[-1] == "1166400,4.0,2.0"
    lines = dst.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "t_s,total_rate_rps,rate_weighted_cv"
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "43200", "86400", "129600", "172800", "216000"]
    assert lines[3:5] == ["86400,2.5,1.5", "129600,4.0,2.0"]  # every other column is copied as it was
    assert load_trace(str(dst)).describe().startswith("week.csv")  # the simulator reads it
    late = tmp_path / "late.csv"
    late.write_text(f"t_s,total_rate_rps\n{DAY_S},1.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="within one day"):
        repeat_days(late, tmp_path / "x.csv", 2)
    with pytest.raises(ValueError, match="--days"):
        repeat_days(src, tmp_path / "x.csv", 0)


@pytest.mark.parametrize("activator", [True, False])
def test_at_zero_pods_the_simulated_operator_sees_what_the_activator_counts(tmp_path, activator):
    """Preheat's queries read the model servers' own counters: with no pod there is no `up` target. With
    scale to zero the activator holds and counts the requests (observe.py reads its counter then), so the
    observation stays fresh and carries the arrivals; without an activator it is stale (NoMetrics) and
    the operator holds, whatever arrives. The simulator sees the same as the operator in both cases."""
    from dataclasses import replace as dc_replace

    from preheat.sim.preheat_policy import PreheatPolicy
    from preheat.sim.run import simulate

    w = prepare_workload(load_trace(write_series(tmp_path / "s.csv", [100.0] * 12)), SimSettings(capacity_rps=50.0))
    overrides = {"min_replicas": 0, "scale_to_zero": True} if activator else {}
    policy = PreheatPolicy(w, load_cold_start("60"), overrides=overrides)
    seen: list[tuple[float, bool, float | None]] = []
    decide = policy.decide

    def forced_to_zero(obs):
        seen.append((obs.time_s, obs.stale, obs.value))
        d = decide(obs)
        return dc_replace(d, serving=0, warm=0) if obs.time_s >= 1800.0 else d  # as if it scaled to zero

    policy.decide = forced_to_zero  # type: ignore[method-assign]
    simulate(w, policy, load_cold_start("60"), SimSettings(capacity_rps=50.0))
    before = [v for t, stale, v in seen if 600.0 <= t < 1800.0]
    after = [(stale, v) for t, stale, v in seen if t >= 2400.0]  # the last pod has drained by then
    assert before and all(v is not None and v > 50.0 for v in before)
    if activator:
        assert after and all(not stale and v is not None and v > 50.0 for stale, v in after)
    else:
        assert after and all(stale and v is None for stale, v in after)


def _pts(*triples):
    return [{"target_utilization": u, "slo_attainment": a, "replica_seconds": 3600.0 * h} for u, a, h in triples]


def _frontiers(preheat, best, oracle):
    policies = {"preheat": {"points": preheat}, "kpa": {"points": best}, "oracle": {"points": oracle}}
    for p in policies.values():
        p["cost_at_slo"] = cost_at_slo(p["points"], (0.99, 0.999))
    return policies


def test_a_missed_target_says_why_in_terms_of_the_deciding_points():
    from preheat_lab import bench_frontier

    oracle = _pts((1.0, 0.995, 90.0))
    # both reach 99 % only at U = 1, the grid's end; Preheat's point buys more attainment for more
    at_end = _frontiers(_pts((0.9, 0.999, 120.0), (1.0, 0.998, 100.0)),
                        _pts((0.9, 0.985, 110.0), (1.0, 0.994, 98.0)), oracle)
    assert "only at U 1, the grid's end" in bench_frontier.why_missed(at_end, "0.99")
    # the baseline's grid point lands just past the target; between points Preheat is cheaper
    grid = _frontiers(_pts((0.8, 0.9995, 100.0), (0.9, 0.985, 80.0)),
                      _pts((0.8, 0.9999, 120.0), (0.9, 0.9901, 95.0)), oracle)
    assert bench_frontier.why_missed(grid, "0.99").startswith("the grid: kpa's point (U 0.9) lands at 99.01 %")
    # lower frontier, no grid excuse; and 100 / 90 > 1.2x the oracle is not (1.11x): one reason only
    below = _frontiers(_pts((0.8, 0.995, 100.0), (0.9, 0.95, 80.0)),
                       _pts((0.8, 0.995, 95.0), (0.9, 0.95, 78.0)), oracle)
    assert bench_frontier.why_missed(below, "0.99") == (
        "kpa's frontier lies below Preheat's here: 99.50 % for 95.0 h at U 0.8, Preheat 99.50 % for 100.0 h at U 0.8")
    # the cheapest, but over 1.2x the oracle: the headroom each needs
    dear = _frontiers(_pts((0.6, 0.995, 200.0)), _pts((0.6, 0.995, 210.0)), oracle)
    assert bench_frontier.why_missed(dear, "0.99") == (
        "2.222x the oracle, which reaches it at U 1 knowing what comes; Preheat needs U 0.6 (headroom for what "
        "it cannot see coming)")
    # both targets held, or no baseline to beat: nothing to explain
    assert bench_frontier.why_missed(_frontiers(_pts((1.0, 0.995, 95.0)), _pts((1.0, 0.995, 99.0)), oracle),
                                     "0.99") == ""
    assert bench_frontier.why_missed(_frontiers(_pts((1.0, 0.995, 95.0)), _pts((1.0, 0.9, 50.0)), oracle),
                                     "0.99") == ""


def test_the_glance_table_puts_each_verdict_in_its_trace_slo_and_cold_start_cell():
    from preheat_lab import bench_frontier

    oracle = _pts((1.0, 0.9995, 90.0))
    # Preheat 100 h against kpa's 125 h at 99 % (20 % cheaper; between kpa's points it reaches 99 % at
    # 115.2 h: 13.2 %); at 99.9 % kpa alone reaches it
    won = _frontiers(_pts((1.0, 0.995, 100.0)), _pts((0.9, 0.9995, 125.0), (1.0, 0.985, 110.0)), oracle)
    # a 0.02 % loss reads +0.02 %, not +0.0 %; the CPU warm pool's figures follow where they differ
    close = _frontiers(_pts((1.0, 0.995, 100.02)), _pts((1.0, 0.995, 100.0)), oracle)
    cheaper = _frontiers(_pts((1.0, 0.995, 90.0)), _pts((1.0, 0.995, 100.0)), oracle)
    docs = [{"trace_key": "t", "cold_key": "30 s", "warm_cost_fractions": {"1": {"policies": won}}},
            {"trace_key": "t", "cold_key": "300 s",
             "warm_cost_fractions": {"1": {"policies": close}, "0.414": {"policies": cheaper}}}]
    lines = bench_frontier.glance(docs).splitlines()
    assert lines[0] == "| trace | SLO | 30 s cold start | measured cold start | 300 s cold start |"
    # without a 0.05 grid measured, the brackets are between the 0.1 grid's points, marked ≈
    assert lines[2] == ("| t | 99 % | −20.0 % kpa (≈ −13.2 % kpa) | not run | "
                        "+0.02 % kpa (≈ +0.02 % kpa); CPU warm pool −10.0 % kpa (≈ −10.0 % kpa) |")
    assert lines[3] == "| t | 99.9 % | Preheat does not reach it (kpa does) | not run | no baseline reaches it |"
    alone = _frontiers(_pts((0.5, 0.9995, 200.0)), _pts((0.5, 0.995, 150.0)), oracle)
    doc = {"trace_key": "t", "cold_key": "measured", "warm_cost_fractions": {"1": {"policies": alone}}}
    assert bench_frontier.glance([doc]).splitlines()[3] == (
        "| t | 99.9 % | not run | no baseline reaches it; Preheat does, 200.0 h | not run |")


def test_a_finer_grid_replaces_the_interpolation_and_explains_a_win_it_takes_back():
    from preheat.sim.verdict import compare
    from preheat_lab import bench_frontier

    oracle = _pts((1.0, 0.9995, 90.0))
    # on the 0.1 grid Preheat (100 h) beats kpa (125 h) at 99 %; kpa's 0.95 point reaches 99 % for 98 h
    coarse = _frontiers(_pts((1.0, 0.995, 100.0)), _pts((0.9, 0.9995, 125.0), (1.0, 0.985, 110.0)), oracle)
    finer = _frontiers(_pts((1.0, 0.995, 100.0), (0.95, 0.996, 104.0)),
                       _pts((0.9, 0.9995, 125.0), (0.95, 0.991, 98.0), (1.0, 0.985, 110.0)), oracle)
    doc = {"trace_key": "t", "cold_key": "30 s", "warm_cost_fractions": {"1": {"policies": coarse}}}
    fine = {("t", "30 s"): {"warm_cost_fractions": {"1": {"policies": finer, "rows": compare(finer)}}}}
    assert bench_frontier.glance([doc], fine).splitlines()[2] == "| t | 99 % | −20.0 % kpa (+2.0 % kpa) | not run | not run |"
    assert bench_frontier.why_missed(coarse, "0.99", compare(finer)["0.99"]) == (
        "won on the 0.1 grid only: on the 0.05 grid kpa reaches it for 98.0 h, Preheat for 100.0 h (2.0 % above kpa)")
    # a 0.05 grid made from other sweeps than the row's (Preheat rerun since) is not used
    stale = _frontiers(_pts((1.0, 0.995, 101.0), (0.95, 0.996, 104.0)), finer["kpa"]["points"], oracle)
    fine_stale = {("t", "30 s"): {"warm_cost_fractions": {"1": {"policies": stale, "rows": compare(stale)}}}}
    assert bench_frontier.glance([doc], fine_stale).splitlines()[2] == (
        "| t | 99 % | −20.0 % kpa (≈ −13.2 % kpa) | not run | not run |")
