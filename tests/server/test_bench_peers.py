"""The pure parts of `make bench-peers` (model-server/bench/bench_peers.py): roofline arithmetic, byte
counts, arrivals, statistics, targets and the README tables. No timing, no download, no server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "model-server" / "bench"


@pytest.fixture(scope="module")
def bp():
    sys.path.insert(0, str(BENCH))  # bench_peers imports bench_http beside it, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("bench_peers", BENCH / "bench_peers.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_gguf_block_bytes(bp):
    # SmolLM2's gate projection, 1536 x 576, in llama.cpp's formats (gguf.GGML_QUANT_SIZES).
    n = 1536 * 576
    assert bp.gguf_tensor_bytes((1536, 576), 1, 4) == 4 * n          # F32
    assert bp.gguf_tensor_bytes((1536, 576), 1, 2) == 2 * n          # F16
    assert bp.gguf_tensor_bytes((1536, 576), 32, 34) == n // 32 * 34  # Q8_0: 8.5 bits a weight
    assert bp.gguf_tensor_bytes((1536, 576), 32, 18) == n // 32 * 18  # Q4_0: 4.5 bits a weight
    with pytest.raises(ValueError):
        bp.gguf_tensor_bytes((3, 5), 32, 18)


def test_bytes_per_token_tied_and_untied(bp):
    vocab, hidden = 100, 8
    table = vocab * hidden * 4
    layers = {"blk.0.ffn_up.weight": 1000, "blk.0.attn_norm.weight": 32}
    tied = bp.decode_bytes_per_token({**layers, "token_embd.weight": table}, "token_embd.weight", vocab)
    assert tied == 1032 + table  # the logits matmul reads the whole table
    untied = bp.decode_bytes_per_token({**layers, "token_embd.weight": table, "output.weight": table}, None, vocab)
    assert untied == 1032 + table + hidden * 4  # output read whole, one input row looked up


def test_roofline(bp):
    # 20 GB/s over 538 MB of fp32 weights: at most ~37 tokens/s alone; 143 MB of Q8_0: ~140.
    assert bp.roofline_tokens_per_s(20e9, 538e6) == pytest.approx(37.17, rel=1e-3)
    assert bp.roofline_tokens_per_s(20e9, 143e6) == pytest.approx(139.86, rel=1e-3)
    with pytest.raises(ValueError):
        bp.roofline_tokens_per_s(20e9, 0)


def test_bert_flops(bp):
    # all-MiniLM-L6-v2: 6 layers, hidden 384, intermediate 1536.
    per_token = 2 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert bp.bert_flops(1, 6, 384, 1536) == 6 * (per_token + 4 * 384)
    assert bp.bert_flops(16, 6, 384, 1536) == 6 * (16 * per_token + 4 * 16 * 16 * 384)


def test_parse_mbw(bp):
    text = ("0\tMethod: MEMCPY\tElapsed: 0.02\tMiB: 256.00000\tCopy: 11000.000 MiB/s\n"
            "AVG\tMethod: MEMCPY\tElapsed: 0.02351\tMiB: 256.00000\tCopy: 10889.144 MiB/s\n"
            "AVG\tMethod: DUMB\tElapsed: 0.05\tMiB: 256.00000\tCopy: 5120.5 MiB/s\n")
    assert bp.parse_mbw(text) == {"memcpy": 10889.144, "dumb": 5120.5}


def test_poisson_arrivals_seeded_and_about_the_rate(bp):
    a = bp.poisson_arrivals(4.0, 100.0, seed=7)
    assert a == bp.poisson_arrivals(4.0, 100.0, seed=7)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 100.0
    assert 300 < len(a) < 500
    with pytest.raises(ValueError):
        bp.poisson_arrivals(0, 10, seed=1)


def test_request_stats(bp):
    samples = [{"ttft": 0.1, "e2e": 1.1, "tokens": 11, "gaps": [0.1] * 10},
               {"ttft": 0.3, "e2e": 2.3, "tokens": 11, "gaps": [0.2] * 10}]
    s = bp.request_stats(samples, wall_s=2.0)
    assert s["output_tokens"] == 22 and s["output_tokens_per_s"] == 11.0
    assert s["ttft_p50_s"] in (0.1, 0.3) and s["ttft_p99_s"] == 0.3
    assert s["itl_p99_s"] == 0.2 and s["tpot_p50_s"] in (0.1, 0.2)


def test_gguf_qtype(bp):
    assert bp.gguf_qtype("blk.0.attn_norm.weight", (576,), "Q4_0") == "F32"
    assert bp.gguf_qtype("blk.0.attn_q.weight", (576, 576), "Q4_0") == "Q4_0"
    assert bp.gguf_qtype("token_embd.weight", (49152, 576), "Q4_0") == "Q8_0"
    assert bp.gguf_qtype("token_embd.weight", (49152, 576), "F16") == "F16"


def _row(system, precision, rates):
    return {"system": system, "precision": precision, "transport": "HTTP, streamed",
            "levels": [{"concurrency": c, "output_tokens_per_s": r, "ttft_p50_s": 0.05} for c, r in rates.items()]}


def _result():
    rows = [_row("preheat-server", "fp32", {1: 20.0, 8: 100.0, 32: 300.0}),
            _row("llama.cpp", "F32", {1: 30.0, 8: 120.0, 32: 150.0}),
            _row("preheat-server", "int8", {1: 50.0, 8: 200.0, 32: 400.0}),
            _row("llama.cpp", "Q8_0", {1: 80.0, 8: 250.0, 32: 300.0}),
            {"system": "llama.cpp", "precision": "Q4_0", "transport": "HTTP", "error": "RuntimeError: boom"}]
    roofline = {"preheat-server/fp32": {"bytes_per_token": 538e6, "roofline_tokens_per_s": 40.0},
                "preheat-server/int8": {"bytes_per_token": 135e6, "roofline_tokens_per_s": 160.0}}
    return rows, roofline


def test_targets(bp):
    rows, roofline = _result()
    t = bp.evaluate_targets(rows, roofline)
    assert t["fp32"]["c32_vs_llama_cpp"] == 2.0 and t["fp32"]["c32_met"] is True
    assert t["fp32"]["c1_fraction_of_roofline"] == 0.5 and t["fp32"]["c1_met"] is False
    assert t["int8"]["c32_vs_llama_cpp"] == pytest.approx(4 / 3) and t["int8"]["c32_met"] is False
    assert t["int8"]["c1_fraction_of_roofline"] == 50 / 160
    assert "c32_vs_llama_cpp" not in t["int4"]  # no rows: nothing claimed
    rows.append(_row("preheat-server", "int4", {1: 2.0, 32: 0.0}))  # nothing streamed in time: a miss, not a gap
    rows.append(_row("llama.cpp", "Q4_0", {1: 30.0, 32: 120.0}))
    roofline["preheat-server/int4"] = {"bytes_per_token": 95e6, "roofline_tokens_per_s": 100.0}
    t = bp.evaluate_targets([r for r in rows if "error" not in r], roofline)
    assert t["int4"]["c32_vs_llama_cpp"] == 0.0 and t["int4"]["c32_met"] is False
    assert t["int4"]["c1_fraction_of_roofline"] == 0.02


def test_tables(bp):
    rows, roofline = _result()
    result = {"decode": rows, "roofline": roofline, "targets": bp.evaluate_targets(rows, roofline),
              "sweep": [{"system": "llama.cpp", "precision": "Q8_0",
                         "rates": [{"rate": 2.0, "requests": 30, "arrivals": 31, "output_tokens_per_s": 120.0, "ttft_p50_s": 0.05,
                                    "ttft_p99_s": 0.2, "itl_p50_s": 0.03, "itl_p99_s": None}]}],
              "embeddings": {"flop_roofline_embeddings_per_s": 1000.0,
                             "rows": [{"system": "preheat encoder", "transport": "in process", "batch": 32,
                                       "embeddings_per_s": 250.0}]}}
    decode = bp.decode_table(result).splitlines()
    assert len(decode) == 2 + len(rows)
    assert "| preheat-server (HTTP, streamed) | fp32 | 538 | 20.0 | 100.0 | 300.0 | 50 / 50 | 40 | 50% |" in decode
    assert "did not run" in decode[-1] and "boom" in decode[-1]
    targets = bp.targets_table(result)
    assert "2.00× vs F32 (met)" in targets and "50% (missed)" in targets
    assert "| llama.cpp | Q8_0 | 2 | 30/31 | 120.0 | 50 / 200 | 30 / – |" in bp.sweep_table(result)
    assert "| 250.0 | 25% |" in bp.embeddings_table(result)
    assert "did not run" in bp.embeddings_table({"embeddings": {"error": "ImportError: x"}})


def test_profile_lines(bp):
    result = {"profile": [{"precision": "int8", "step_p50_ms": 40.0, "per_layer_ms": 40 / 30, "ops_per_step": 3000,
                           "bandwidth_floor_ms_per_step": 7.5,
                           "top_ops": [{"op": "aten::_weight_int8pack_mm", "self_ms_per_step": 20.0}]}]}
    line = bp.profile_lines(result)
    assert line.startswith("- int8: a c=1 decode step takes 40.0 ms in process (1.33 ms per layer, 3000 profiled")
    assert "aten::_weight_int8pack_mm 20.0 ms" in line and line.endswith("7.5 ms")
    assert bp.profile_lines({}) == ""
