"""Weight-only int8/int4: kernels agree with dequantized references, quantized models stay close to fp32,
weight bytes shrink by the expected ratios, the engine runs them, and the evaluator command works."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest
import torch
from preheat_server.engine import EngineConfig, LLMEngine, SamplingParams
from preheat_server.models import load_model
from preheat_server.models.builtin import builtin_config, random_weights, save_hf_folder, train_tokenizer
from preheat_server.quant import (
    Int4Embedding,
    Int4Linear,
    Int8Linear,
    cpu_kernel_dtype,
    dequantize_int4,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_quant_cache(tmp_path_factory: Any, monkeypatch: Any) -> None:
    """Quantized weights these tests produce go to a temporary cache, not the user's."""
    from preheat_server.quant import cache as qcache

    root = tmp_path_factory.mktemp("quant-cache")
    monkeypatch.setattr(qcache, "cache_root", lambda: root)


def test_int8_linear_matches_dequantized_weight():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 64, generator=g), torch.randn(5, 64, generator=g)
    q, s = quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and s.shape == (96,)
    assert (q.float() * s[:, None] - w).abs().max() <= s.max() / 2 + 1e-6  # rounding error ≤ half a step
    lin = Int8Linear(q, s, None, torch.float32)
    ref = x @ (q.float() * s[:, None]).T
    assert lin.kernel_dtype == cpu_kernel_dtype(torch.float32)  # the path this machine takes
    lin.kernel_dtype = torch.float32  # the exact path
    torch.testing.assert_close(lin(x), ref, rtol=1e-4, atol=1e-4)
    lin.kernel_dtype = torch.bfloat16  # the fast path: the input rounded to bf16, fp32 out
    got = lin(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, x.bfloat16().float() @ (q.float() * s[:, None]).T, rtol=2e-2, atol=2e-2)
    lin.use_packed = False  # the pure-torch fallback gives the same numbers
    torch.testing.assert_close(lin(x), ref, rtol=1e-4, atol=1e-4)


def test_int4_linear_matches_dequantized_weight():
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(64, 256, generator=g), torch.randn(3, 256, generator=g)
    q, sz = quantize_int4_groupwise(w, 64)
    assert int(q.min()) >= 0 and int(q.max()) <= 15 and sz.shape == (4, 64, 2)
    deq = dequantize_int4(q, sz, 64)
    step = sz[..., 0].t().repeat_interleave(64, dim=1)
    assert ((deq - w).abs() <= step / 2 + 1e-5).all()
    lin = Int4Linear(w, None, torch.float32, 64)
    ref = x @ dequantize_int4(q, sz.to(torch.bfloat16), 64).T  # stored scales are bf16
    assert lin.kernel_dtype == (cpu_kernel_dtype(torch.float32) if lin.mode == "cpu" else torch.float32)
    lin.kernel_dtype = torch.float32  # the exact path
    torch.testing.assert_close(lin(x), ref, rtol=1e-3, atol=1e-3)
    if lin.mode == "cpu":  # the fast path: the input rounded to bf16 (the kernel also sums in bf16)
        lin.kernel_dtype = torch.bfloat16
        deq = dequantize_int4(q, sz.to(torch.bfloat16), 64)
        torch.testing.assert_close(lin(x), x.bfloat16().float() @ deq.T, rtol=5e-2, atol=5e-2)
    fallback = Int4Linear(w, None, torch.float32, 64)
    fallback.mode, fallback.weight = "dequant", (q[:, ::2].to(torch.uint8) << 4) | q[:, 1::2].to(torch.uint8)
    torch.testing.assert_close(fallback(x), ref, rtol=1e-3, atol=1e-3)


def test_int4_embedding_dequantizes_only_looked_up_rows():
    w = torch.randn(50, 128, generator=torch.Generator().manual_seed(2))
    emb = Int4Embedding(w, torch.float32, 64)
    ids = torch.tensor([[3, 7], [49, 0]])
    out = emb(ids)
    assert out.shape == (2, 2, 128)
    assert (out - w[ids]).abs().max() < 0.5


@pytest.fixture(scope="module")
def untied_folder(tmp_path_factory):
    """A Llama with hidden 256 (untied, like real checkpoints) for byte ratios and quality."""
    tok = train_tokenizer(1024, 1234)
    cfg = dataclasses.replace(builtin_config("tiny", tok.token_to_id("<|endoftext|>")), hidden_size=256,
                              intermediate_size=768, num_attention_heads=8, num_key_value_heads=4, head_dim=32)
    folder = tmp_path_factory.mktemp("untied")
    save_hf_folder(folder, cfg, random_weights(cfg, seed=5), tok)
    return folder


def test_weight_bytes_ratios(untied_folder):
    sizes = {p: load_model(str(untied_folder), device="cpu", precision=p).weight_bytes
             for p in ("fp32", "bf16", "int8", "int4")}
    assert sizes["fp32"] == 2 * sizes["bf16"]
    assert sizes["int8"] <= 0.55 * sizes["bf16"]
    assert sizes["int4"] <= 0.30 * sizes["bf16"]


@pytest.mark.parametrize(("precision", "max_rel_err", "min_agreement"), [("int8", 0.05, 0.9), ("int4", 0.35, 0.5)])
def test_quantized_logits_close_to_fp32(untied_folder, precision, max_rel_err, min_agreement):
    ids = torch.randint(3, 1024, (2, 64), generator=torch.Generator().manual_seed(3))
    ref = load_model(str(untied_folder), device="cpu", precision="fp32").model.forward_dense(ids)
    got = load_model(str(untied_folder), device="cpu", precision=precision).model.forward_dense(ids)
    rel = ((got - ref).norm() / ref.norm()).item()
    agreement = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert rel <= max_rel_err
    assert agreement >= min_agreement
    assert not torch.equal(got, ref)  # really quantized


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_fused_quantized_projections_equal_separately_quantized(untied_folder, precision):
    """Fusing before quantizing is exact: int8 scales are per output row, int4 groups run along a row."""
    fused = load_model(str(untied_folder), device="cpu", precision=precision)
    plain = load_model(str(untied_folder), device="cpu", precision=precision, fuse=False)
    assert fused.weight_bytes == plain.weight_bytes
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4))
    for fl, pl in zip(fused.model.model.layers, plain.model.model.layers, strict=True):
        fa, pa, fm, pm = fl.self_attn, pl.self_attn, fl.mlp, pl.mlp
        kind = Int8Linear if precision == "int8" else Int4Linear
        assert isinstance(fa.qkv_proj, kind) and isinstance(fm.gate_up_proj, kind)
        parts = {"qkv": [pa.q_proj, pa.k_proj, pa.v_proj], "gate_up": [pm.gate_proj, pm.up_proj]}
        for name, lin in (("qkv", fa.qkv_proj), ("gate_up", fm.gate_up_proj)):
            if precision == "int8":
                assert torch.equal(lin.weight, torch.cat([p.weight for p in parts[name]]))
                assert torch.equal(lin.scales, torch.cat([p.scales for p in parts[name]]))
            else:
                assert torch.equal(lin.scales_and_zeros, torch.cat([p.scales_and_zeros for p in parts[name]], dim=1))
            torch.testing.assert_close(lin(x), torch.cat([p(x) for p in parts[name]], dim=-1), rtol=1e-5, atol=1e-5)
    ids = torch.randint(3, 1024, (1, 40), generator=torch.Generator().manual_seed(6))
    a, b = fused.model.forward_dense(ids), plain.model.forward_dense(ids)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("precision", ["int8", "int4", "bf16"])
def test_engine_serves_quantized_model_like_recompute(precision):
    loaded = load_model("tiny", device="cpu", precision=precision)
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=64))
    prompt = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 222, 333]
    got = engine.generate([prompt, prompt[:5]], SamplingParams(max_tokens=8, ignore_eos=True))
    ids = list(prompt)
    for _ in range(8):
        ids.append(int(loaded.model.forward_dense(torch.tensor([ids]))[0, -1].argmax()))
    assert got[0] == ids[len(prompt):]
    assert engine.stats().num_free_blocks == 64


def test_evaluate_command_prints_quality_and_bytes(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("The warm pool keeps a replica ready. Cold starts take minutes. Café, 東京.\n" * 20)
    proc = subprocess.run(
        [sys.executable, "-m", "preheat_server.quant.evaluate", "--model", "tiny", "--text", str(text),
         "--precisions", "fp32", "int8", "int4", "--window", "64"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["precision", "perplexity"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert set(rows) == {"fp32", "int8", "int4"}
    assert float(rows["fp32"][2]) == 0.0 and float(rows["fp32"][4]) == 1.0
    b = {k: int(v[5].replace(",", "")) for k, v in rows.items()}
    assert b["int4"] < b["int8"] < b["fp32"]
    bad = subprocess.run([sys.executable, "-m", "preheat_server.quant.evaluate", "--model", "tiny",
                          "--text", str(tmp_path / "missing.txt")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "error" in bad.stderr


def test_int4_group_size_divides_every_matrix():
    from preheat_server.quant.quantize import int4_group_size

    assert [int4_group_size(k) for k in (576, 1536, 192, 96, 4096)] == [64, 128, 64, 32, 128]
    with pytest.raises(ValueError, match="not a multiple of 32"):
        int4_group_size(100)


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_weights_are_cached_and_a_cached_start_does_not_quantize(
        tmp_path: Any, monkeypatch: Any, precision: str) -> None:
    from preheat_server.quant import cache as qcache
    from preheat_server.quant import quantize as qmod

    monkeypatch.setattr(qcache, "cache_root", lambda: tmp_path)
    first = load_model("tiny", device="cpu", precision=precision)
    files = list((tmp_path / "quantized").glob(f"{precision}-*.safetensors"))
    assert len(files) == 1

    def refuse(*_args: Any) -> None:
        raise AssertionError("a cached start must not quantize again")

    monkeypatch.setattr(qmod, "quantize_int8_per_channel", refuse)
    monkeypatch.setattr(qmod, "quantize_int4_groupwise", refuse)
    second = load_model("tiny", device="cpu", precision=precision)
    ids = torch.tensor([[3, 17, 42, 99, 5, 8]])
    assert torch.equal(first.model.forward_dense(ids), second.model.forward_dense(ids))
    assert second.weight_bytes == first.weight_bytes


def test_quant_cache_key_follows_the_content(tmp_path: Any, monkeypatch: Any) -> None:
    from preheat_server.quant import cache as qcache

    monkeypatch.setattr(qcache, "cache_root", lambda: tmp_path / "cache")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 100)
    key = qcache.cache_file([weights], "int4", 128, True)
    assert qcache.cache_file([weights], "int4", 128, True) == key
    assert qcache.cache_file([weights], "int8", 128, True) != key
    weights.write_bytes(b"b" * 100)       # same size, new content (and mtime)
    assert qcache.cache_file([weights], "int4", 128, True) != key


def test_quantized_cpu_kernels_take_bf16_input_only_where_it_is_vectorised(monkeypatch):
    """aten's int8/int4 CPU kernels are scalar for fp32 input: an fp32 model feeds them bf16 on AVX2 or
    AVX-512 builds, keeps fp32 without a vectorised build, and PREHEAT_QUANT_ACTIVATIONS=fp32 forces it."""
    for capability, want in (("AVX512", torch.bfloat16), ("AVX2", torch.bfloat16), ("DEFAULT", torch.float32)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert cpu_kernel_dtype(torch.float32) == want
        assert cpu_kernel_dtype(torch.bfloat16) == torch.bfloat16  # a bf16 model is fed as it is
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv("PREHEAT_QUANT_ACTIVATIONS", "fp32")
    assert cpu_kernel_dtype(torch.float32) == torch.float32


def test_int8_weights_from_an_unaligned_view_are_aligned_for_the_kernel():
    """A weight that is a view into a loaded file may start off a 64-byte boundary; aten's AVX-512 int8
    kernel with bf16 input crashed on one (the quantized tiny model from the cache), so it is copied."""
    g = torch.Generator().manual_seed(4)
    q, s = quantize_int8_per_channel(torch.randn(256, 128, generator=g))
    backing = torch.empty(q.numel() + 8, dtype=torch.int8)
    view = backing[8:].view(256, 128)
    view.copy_(q)
    assert view.data_ptr() % 64 != 0
    lin = Int8Linear(view, s, None, torch.float32)
    assert lin.weight.data_ptr() % 64 == 0
    lin.kernel_dtype = torch.bfloat16
    x = torch.randn(8, 128, generator=g)
    torch.testing.assert_close(lin(x), x.bfloat16().float() @ (q.float() * s[:, None]).T, rtol=2e-2, atol=2e-2)
