"""`preheat simulate` end to end on a committed excerpt: table, JSON and PNG; bad input exits 2."""

from __future__ import annotations

import json

import pytest
from preheat.cli import main as preheat_main

from .tracegen import write_series


def test_simulate_all_policies_writes_json_and_png(data_dir, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = preheat_main([
        "simulate", "--trace", str(data_dir / "mooncake_conversation_excerpt.jsonl"), "--policy", "all",
        "--slo-ms", "5000", "--cold-start", "20", "--capacity-rps", "0.5", "--json", str(out), "--plot", str(png),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"preheat", "hpa", "kpa", "keda", "aibrix", "fixed", "oracle"}
    for r in doc["policies"].values():
        for key in ("slo_attainment", "p50_latency_ms", "p99_latency_ms", "replica_seconds", "scale_actions",
                    "cold_starts", "cold_starts_hidden_by_promotions"):
            assert key in r
        assert 0.0 <= r["slo_attainment"] <= 1.0
        assert r["requests"] == 300
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "oracle" in capsys.readouterr().out


def test_simulate_cold_start_file_and_token_signal(data_dir, tmp_path):
    cold = tmp_path / "cold.csv"
    cold.write_text("cold_start_ms\n5000\n20000\n45000\n")
    out = tmp_path / "r.json"
    rc = preheat_main([
        "simulate", "--trace", str(data_dir / "azure_llm_2023_code_excerpt.csv"), "--policy", "hpa,oracle",
        "--cold-start", str(cold), "--capacity-tps", "20000", "--json", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"hpa", "oracle"}
    assert "tokens/s" in doc["fleet"] and "cold.csv" in doc["cold_start"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "/nonexistent/trace.csv"], "not found"),
        (["--policy", "magic"], "unknown policy"),
        (["--cold-start", "soon"], "neither a number nor an existing file"),
        (["--capacity-rps", "-3"], "positive"),
        (["--slo-ms", "0"], "slo-ms"),
        (["--preheat", "no_such_field=1"], "preheat"),
        (["--capacity-tps", "100"], "token counts"),
        (["--plot-window", "tomorrow"], "START_H:END_H"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, args, message):
    trace = write_series(tmp_path / "s.csv", [10.0, 12.0, 11.0])
    argv = ["simulate", "--trace", str(trace), "--policy", "hpa", *args]
    assert preheat_main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_series_without_traffic_asks_for_a_capacity_and_runs_with_one(tmp_path, capsys):
    trace = write_series(tmp_path / "zeros.csv", [0.0, 0.0, 0.0])
    assert preheat_main(["simulate", "--trace", str(trace), "--policy", "hpa"]) == 2
    err = capsys.readouterr().err
    assert "no traffic" in err and "--capacity-rps" in err
    out = tmp_path / "r.json"
    assert preheat_main(["simulate", "--trace", str(trace), "--policy", "preheat,hpa", "--capacity-rps", "1",
                         "--json", str(out)]) == 0
    table = capsys.readouterr().out
    doc = json.loads(out.read_text())
    for name in ("preheat", "hpa"):
        r = doc["policies"][name]
        assert r["requests"] == 0 and r["p50_latency_ms"] is None
        # no request at all prints "-", not "inf" (which means requests never served)
        row = next(line for line in table.splitlines() if line.startswith(name))
        assert row.split()[2:4] == ["-", "-"]


def test_simulate_score_after_is_in_the_header_and_json_and_refused_past_the_end(tmp_path, capsys):
    trace = write_series(tmp_path / "d.csv", [100.0, 120.0, 90.0, 110.0, 100.0, 95.0])
    out = tmp_path / "r.json"
    args = ["simulate", "--trace", str(trace), "--policy", "fixed", "--json", str(out)]
    assert preheat_main([*args, "--score-after", "1200"]) == 0
    assert "scored from 1200 s" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["score_after_s"] == 1200.0
    assert preheat_main(args) == 0
    full = json.loads(out.read_text())
    fixed, fixed_full = doc["policies"]["fixed"], full["policies"]["fixed"]
    assert fixed["requests"] < fixed_full["requests"] and fixed["replica_seconds"] < fixed_full["replica_seconds"]
    assert preheat_main([*args, "--score-after", "3600"]) == 2
    assert "--score-after must be at least 0 s and before the trace ends" in capsys.readouterr().err


def test_simulate_by_day_prints_each_day_and_json_carries_them(tmp_path, capsys):
    series = write_series(tmp_path / "s.csv", [100.0] * 144 + [100.0] * 60 + [4000.0] + [100.0] * 83)
    out = tmp_path / "r.json"
    rc = preheat_main(["simulate", "--trace", str(series), "--policy", "hpa", "--capacity-rps", "40",
                       "--by-day", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "hpa by day:" in text
    days = json.loads(out.read_text())["policies"]["hpa"]["days"]
    assert [d["day"] for d in days] == [0, 1]
    for d in days:  # one printed row a day: day, requests, late, attainment, replica-hours
        att = 100 * (1 - d["late"] / d["requests"])
        row = f"{d['day']:>4} {d['requests']:>12.0f} {d['late']:>10.0f} {att:>8.2f} {d['replica_seconds'] / 3600:>10.2f}"
        assert row in text
    assert days[0]["late"] < days[1]["late"]
