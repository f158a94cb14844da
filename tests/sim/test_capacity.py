"""`preheat plan` figures: weight memory by precision, KV bytes per token, replicas and cost."""

from __future__ import annotations

import json

import pytest
from preheat.capacity import main


def run_json(capsys, *args: str) -> dict:
    assert main([*args, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_7b_weights_by_precision(capsys):
    fp16 = run_json(capsys, "--params", "7e9")
    assert fp16["weight_gb"] == pytest.approx(14.0, rel=0.03)
    int8 = run_json(capsys, "--params", "7e9", "--precision", "int8")
    assert int8["weight_gb"] == pytest.approx(7.0, rel=0.03)
    assert fp16["weights_by_precision_gb"]["int4"] == pytest.approx(3.5, rel=0.05)
    assert main(["--params", "7e9"]) == 0
    text = capsys.readouterr().out
    assert "14.00 GB" in text and "int8 7.1 GB" in text


def test_llama2_7b_kv_cache_is_half_a_mib_per_token(capsys):
    p = run_json(capsys, "--params", "6.7e9", "--layers", "32", "--kv-heads", "32", "--head-dim", "128",
                 "--context", "4096", "--concurrency", "8")
    assert p["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2 == 0.5 * 2**20
    assert p["kv_bytes_per_sequence"] == 0.5 * 2**20 * 4096
    assert p["kv_gb_for_concurrency"] == pytest.approx(8 * 0.5 * 2**20 * 4096 / 1e9)


def test_hf_config_llama3_8b_gqa(tmp_path, capsys):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu",
           "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    p = run_json(capsys, "--config", str(path), "--precision", "bf16")
    assert p["kv_bytes_per_token"] == 128 * 1024  # grouped-query attention: 128 KiB per token
    assert p["model"]["params"] == pytest.approx(8.03e9, rel=0.01)


def test_replicas_and_cost_per_million_tokens(capsys):
    p = run_json(capsys, "--params", "7e9", "--rate", "10", "--input-tokens", "500", "--output-tokens", "500",
                 "--gpu-tps", "5000", "--cpu-tps", "100", "--gpu-hour-usd", "3.6", "--cpu-hour-usd", "0.36",
                 "--managed-usd-per-mtok", "1.0", "--target-utilization", "0.5")
    # 10 req/s x 1000 tokens = 10k tokens/s; a GPU replica carries 5000 x 0.5 = 2500 -> 4 replicas
    assert p["replicas_gpu"] == 4 and p["replicas_cpu"] == 200
    # 3.6 USD/h over 2500 tokens/s -> 3.6 / 9e6 x 1e6 = 0.4 USD per million tokens
    assert p["cost"]["gpu_usd_per_mtok"] == pytest.approx(0.4)
    assert p["cost"]["cpu_usd_per_mtok"] == pytest.approx(0.36 / (50 * 3600) * 1e6)
    assert p["cost"]["managed_usd_per_hour"] == pytest.approx(10 * 1000 * 3600 / 1e6)


@pytest.mark.parametrize("args", [[], ["--params", "-5"], ["--params", "7e9", "--rate", "0"],
                                  ["--config", "/nonexistent.json"]])
def test_bad_input_exits_2(capsys, args):
    assert main(args) == 2
    assert "error" in capsys.readouterr().err
