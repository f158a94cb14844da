"""`make bench-heldout`: its variants are built as described and run what `preheat frontier` runs."""

from __future__ import annotations

import csv
import json

import pytest
from preheat_lab.bench_heldout import (
    Variant,
    idle_copy,
    markdown,
    reshaped_copy,
    run_variant,
    seeds_markdown,
    tally,
)

from .tracegen import write_series

# Six hours at 10-minute windows: quiet spells between two busy hours.
RATES = [2.0] * 9 + [60.0, 80.0, 90.0, 80.0, 60.0, 50.0] + [3.0] * 6 + [70.0, 90.0, 60.0] + [1.0] * 12


def test_idle_copy_zeroes_the_quietest_two_fifths_and_keeps_the_rest(tmp_path):
    src = write_series(tmp_path / "d.csv", RATES)
    out = idle_copy(src, tmp_path / "idle.csv")
    with out.open() as f:
        got = [float(r["total_rate_rps"]) for r in csv.DictReader(f)]
    # 36 windows: the cut is the 15th quietest rate (2.0); windows below it go, the rest stay as they were
    cut = sorted(RATES)[int(0.4 * len(RATES))]
    assert got == [0.0 if r < cut else r for r in RATES]
    assert got.count(0.0) == 12  # the twelve 1.0 windows; the 2.0s tie at the cut and stay


def test_reshaped_copies_scale_the_rate_over_the_trace_and_keep_the_other_columns(tmp_path):
    path = tmp_path / "cv.csv"
    path.write_text("t_s,total_rate_rps,rate_weighted_cv\n" + "".join(f"{i * 600},{r},1.5\n" for i, r in enumerate(RATES)))
    got = {}
    for kind in ("growth", "step", "drop"):
        with reshaped_copy(path, tmp_path / f"{kind}.csv", kind).open() as f:
            got[kind] = list(csv.DictReader(f))
    n = len(RATES)
    rate = {k: [float(r["total_rate_rps"]) for r in rows] for k, rows in got.items()}
    assert rate["growth"][0] == RATES[0] and rate["growth"][-1] == pytest.approx(3 * RATES[-1])
    assert rate["growth"][n // 2] == pytest.approx(RATES[n // 2] * 3 ** ((n // 2) / (n - 1)))
    first_half = [i for i in range(n) if i / (n - 1) < 0.5]
    assert rate["step"] == pytest.approx([r * (1 if i in first_half else 2) for i, r in enumerate(RATES)])
    assert rate["drop"] == pytest.approx([r * (1 if i in first_half else 0.5) for i, r in enumerate(RATES)])
    assert all(r["rate_weighted_cv"] == "1.5" for rows in got.values() for r in rows)
    assert [r["t_s"] for r in got["step"]] == [str(i * 600) for i in range(n)]


def test_a_variant_s_preheat_settings_reach_preheat_and_only_preheat(tmp_path):
    path = idle_copy(write_series(tmp_path / "d.csv", RATES), tmp_path / "idle.csv")
    plain = run_variant(Variant("idle", "deepseek-r1", idle=True), path, "30")
    floor = run_variant(Variant("idle-floor", "deepseek-r1", idle=True, preheat=("min_replicas=4",)), path, "30")
    assert "--preheat min_replicas=4" in floor["command"]
    cost = {name: [p["replica_seconds"] for p in r["policies"]["preheat"]["points"]] for name, r in
            (("plain", plain), ("floor", floor))}
    # idle spells at four replicas instead of one: dearer at every U
    assert all(f > p for f, p in zip(cost["floor"], cost["plain"], strict=True))
    assert plain["policies"]["kpa"]["points"] == floor["policies"]["kpa"]["points"]
    table = markdown([plain, floor])
    assert table.count("| idle-floor | 30 s |") == 2 and table.count("| idle | 30 s |") == 2
    # the tally is every policy at its defaults: a user's Preheat settings are rows of their own
    assert tally([plain])["rows"] > 0 and tally([plain, floor]) == tally([plain])


def test_a_seed_draws_other_arrivals_and_says_so(tmp_path):
    # The same windows with a recorded inter-arrival CV: the seed draws the arrivals inside each window.
    path = tmp_path / "cv.csv"
    path.write_text("t_s,total_rate_rps,rate_weighted_cv\n"
                    + "".join(f"{i * 600},{r},1.5\n" for i, r in enumerate(RATES)))
    v = Variant("cv", "deepseek-r1")
    runs = {seed: run_variant(v, path, "30", seed) for seed in (0, 1)}
    assert runs[0]["seed"] == 0 and runs[1]["seed"] == 1
    assert "--seed" not in runs[0]["command"] and "--seed 1" in runs[1]["command"]
    again = run_variant(v, path, "30", 0)  # the same seed draws the same arrivals
    assert again["policies"]["kpa"]["points"] == runs[0]["policies"]["kpa"]["points"]
    assert runs[1]["policies"]["kpa"]["points"] != runs[0]["policies"]["kpa"]["points"]
    table = seeds_markdown({0: [runs[0]], 1: [runs[1]]})
    assert table.count("| cv | 30 s |") == 2  # one row per SLO target, a column per seed
    assert "- seed 0: Preheat the cheapest in" in table and "- seed 1: Preheat the cheapest in" in table


def test_oracle_only_reruns_the_reference_and_keeps_every_causal_policy_s_sweep(tmp_path):
    path = idle_copy(write_series(tmp_path / "d.csv", RATES), tmp_path / "idle.csv")
    v = Variant("idle", "deepseek-r1", idle=True)
    full = run_variant(v, path, "30")
    stored = json.loads(json.dumps(full))
    stored["policies"]["kpa"]["points"][0]["replica_seconds"] = 1.0  # a mark: kept rows are not rerun
    stored["policies"]["oracle"] = {"points": [], "cost_at_slo": {"0.99": None, "0.999": None}, "cpu_s": 0.0}
    again = run_variant(v, path, "30", kept=stored)
    assert again["policies"]["kpa"]["points"][0]["replica_seconds"] == 1.0
    assert again["policies"]["preheat"] == stored["policies"]["preheat"]
    assert again["policies"]["oracle"]["points"] == full["policies"]["oracle"]["points"]  # the reference, rerun
    assert again["rows"]["0.99"]["cost"]["oracle"] == full["rows"]["0.99"]["cost"]["oracle"] is not None
    # the kept sweeps say where they ran (the stored row's run), and a second rerun keeps that record
    assert again["causal_sweeps_from"] == {k: stored[k] for k in ("machine", "finished_utc", "cpu_s")}
    assert "causal_sweeps_from" not in full
    stored_again = json.loads(json.dumps(again)) | {"finished_utc": "later"}
    assert run_variant(v, path, "30", kept=stored_again)["causal_sweeps_from"] == again["causal_sweeps_from"]


def test_preheat_only_reruns_preheat_and_keeps_the_baselines_and_the_oracle(tmp_path):
    path = idle_copy(write_series(tmp_path / "d.csv", RATES), tmp_path / "idle.csv")
    v = Variant("idle", "deepseek-r1", idle=True)
    full = run_variant(v, path, "30")
    stored = json.loads(json.dumps(full))
    stored["policies"]["kpa"]["points"][0]["replica_seconds"] = 1.0  # marks: kept sweeps are not rerun
    stored["policies"]["oracle"]["points"][0]["replica_seconds"] = 2.0
    stored["policies"]["preheat"] = {"points": [], "cost_at_slo": {"0.99": None, "0.999": None}, "cpu_s": 0.0}
    again = run_variant(v, path, "30", kept=stored, rerun="preheat")
    assert again["policies"]["kpa"]["points"][0]["replica_seconds"] == 1.0
    assert again["policies"]["oracle"]["points"][0]["replica_seconds"] == 2.0
    assert again["policies"]["preheat"]["points"] == full["policies"]["preheat"]["points"]  # rerun
    assert again["rows"]["0.99"]["cost"]["preheat"] == full["rows"]["0.99"]["cost"]["preheat"]
    # the kept sweeps say where they ran, and a later oracle rerun keeps both records apart
    ran = {k: stored[k] for k in ("machine", "finished_utc", "cpu_s")}
    assert again["rerun"] == "preheat" and again["baseline_sweeps_from"] == ran
    assert again["oracle_sweeps_from"] == {k: stored[k] for k in ("machine", "finished_utc")}
    assert "causal_sweeps_from" not in again
    oracle_again = run_variant(v, path, "30", kept=json.loads(json.dumps(again)))
    assert oracle_again["causal_sweeps_from"]["baselines"] == ran
    assert oracle_again["causal_sweeps_from"]["preheat"]["finished_utc"] == again["finished_utc"]
