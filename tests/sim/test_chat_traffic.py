"""`preheat_lab.chat_traffic` and `make bench-chat`: synthetic one-hour chat traffic, burstier with its sigma,
loads as a per-request trace with tokens, and the bench's table says Preheat's margin per cell."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.sim.traces import load_trace
from preheat.sim.verdict import compare
from preheat_lab.bench_chat import main as bench_main
from preheat_lab.bench_chat import markdown
from preheat_lab.chat_traffic import HOUR_S, PRESETS, Shape, main, requests, segment_rates


def _count_cv(shape: Shape, seed: int, bin_s: float = 60.0) -> float:
    t, _, _ = requests(shape, seed)
    counts = np.bincount((t // bin_s).astype(int), minlength=int(HOUR_S // bin_s))
    return float(counts.std() / counts.mean())


def test_a_seed_draws_the_same_hour_and_another_seed_another():
    a, b, c = requests(PRESETS["medium"], 1), requests(PRESETS["medium"], 1), requests(PRESETS["medium"], 2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    t, inp, out = a
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < HOUR_S
    assert inp.min() >= 1 and out.min() >= 1 and len(inp) == len(out) == len(t)
    assert 12_000 < len(t) < 30_000  # ~5.4 requests/s for an hour, the swing and the bursts around it


def test_per_minute_counts_are_burstier_with_sigma_and_plain_poisson_without():
    flat = Shape(0.0, 60.0, 0.0)
    rates = segment_rates(flat, 3)
    assert np.allclose(rates, rates[0])  # sigma 0 and no swing: one rate all hour
    # Poisson at ~324 per minute: CV ~ 1 / sqrt(324) ~ 0.056
    assert _count_cv(flat, 3) < 0.09
    cvs = [np.mean([_count_cv(PRESETS[p], s) for s in (1, 2, 3)]) for p in ("mild", "medium", "bursty")]
    assert cvs[0] > 0.09 and cvs[0] < cvs[1] < cvs[2]


def test_the_written_trace_loads_with_tokens_and_bad_shapes_are_refused(tmp_path, capsys):
    out = tmp_path / "c.csv"
    assert main([str(out), "--preset", "mild", "--seed", "4"]) == 0
    trace = load_trace(str(out))
    assert trace.has_tokens and len(trace.arrival_s) == len(requests(PRESETS["mild"], 4)[0])
    with pytest.raises(SystemExit):
        main([str(out), "--segment-s", "0"])
    assert "segment_s > 0" in capsys.readouterr().err


def _cell(preheat: float | None, kpa: float | None) -> dict:
    def pol(cost):
        pts = [] if cost is None else [{"slo_attainment": 0.9995, "replica_seconds": cost}]
        return {"points": pts, "cost_at_slo": {"0.99": cost, "0.999": cost}}
    return {"preset": "medium", "seed": 1, "cold_key": "30 s",
            "verdict": compare({"preheat": pol(preheat), "kpa": pol(kpa), "oracle": pol(3600.0)})}


def test_the_table_gives_each_policy_s_hours_preheat_s_margin_and_its_ratio_to_the_oracle():
    table = markdown([_cell(4 * 3600.0, 5 * 3600.0), _cell(None, 2 * 3600.0)])
    assert "| medium | 1 | 30 s | 99 % | 4.0 | — | — | 5.0 | — | — | 1.0 | 20.0 % below kpa | 4.00x |" in table
    assert "| medium | 1 | 30 s | 99.9 % | — | — | — | 2.0 | — | — | 1.0 | Preheat does not reach it | — |" in table


def test_an_unknown_preset_is_refused_with_a_message(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        bench_main(["--out-dir", str(tmp_path), "--presets", "stormy"])
    assert e.value.code == 2
    assert "unknown preset(s) stormy" in capsys.readouterr().err
