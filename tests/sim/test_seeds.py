"""`make bench-seeds`: other draws of the arrivals inside each window, and the verdict per seed."""

from __future__ import annotations

import pytest
from preheat_lab.bench_seeds import COMPETITORS, main, markdown, run_seed, tally, verdict

# Six hours at 10-minute windows with the inter-arrival CV the ServeGen series record per window.
RATES = [2.0] * 9 + [60.0, 80.0, 90.0, 80.0, 60.0, 50.0] + [3.0] * 6 + [70.0, 90.0, 60.0] + [1.0] * 12


def write_bursty_series(path, rates, cv=3.0):
    lines = ["t_s,total_rate_rps,rate_weighted_cv"] + [f"{i * 600},{r},{cv}" for i, r in enumerate(rates)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_seed_draws_other_arrivals_and_the_same_seed_the_same(tmp_path):
    path = write_bursty_series(tmp_path / "s.csv", RATES)
    one, again, two = run_seed(path, "30", 1), run_seed(path, "30", 1), run_seed(path, "30", 2)
    assert set(one) == set(COMPETITORS) and "oracle" not in one
    points = {name: [p["slo_attainment"] for p in r["fixed"]["points"]] for name, r in (("1", one), ("2", two))}
    assert points["1"] != points["2"]  # a fixed fleet sees only the arrivals: they differ
    assert [p["replica_seconds"] for p in one["preheat"]["points"]] == [
        p["replica_seconds"] for p in again["preheat"]["points"]]


def _policies(preheat: float | None, hpa: float | None) -> dict:
    def pol(cost):
        pts = [] if cost is None else [{"slo_attainment": 0.9995, "replica_seconds": cost}]
        return {"points": pts, "cost_at_slo": {"0.99": cost, "0.999": cost}}
    return {"preheat": pol(preheat), "hpa": pol(hpa)}


def test_verdict_tally_and_table_count_each_seed_where_a_baseline_reaches_the_slo():
    doc = {"seeds": [0, 1], "cells": [
        {"trace_key": "m-small", "cold_key": "30 s", "by_seed": {
            "0": verdict(_policies(90.0, 100.0)),  # 10 % below the HPA
            "1": verdict(_policies(110.0, 100.0)),  # 10 % above
        }},
        {"trace_key": "m-mid", "cold_key": "300 s", "by_seed": {"0": verdict(_policies(90.0, None))}},
    ]}
    assert doc["cells"][0]["by_seed"]["0"]["0.99"]["best_baseline"] == "hpa"
    assert tally(doc) == {"cells": 4, "cheapest_on_grid": 2, "cheapest_interpolated": 2}
    table = markdown(doc)
    assert "| m-small | 30 s | 99 % | 10.0 % below hpa / 10.0 % below hpa | 10.0 % above hpa / 10.0 % above hpa |" in table
    assert "| m-mid | 300 s | 99.9 % | no baseline reaches it / no baseline reaches it | — |" in table


def test_a_trace_the_seed_does_not_draw_is_refused_with_a_message(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--only", "mooncake"])
    assert e.value.code == 2
    assert "mooncake is not one of the series whose arrivals a seed draws" in capsys.readouterr().err
