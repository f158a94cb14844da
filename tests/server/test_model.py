"""The Llama model and its loader: logits equal transformers' LlamaForCausalLM on the same HF folder;
config spellings, sharded checkpoints, tied embeddings and GQA variants; built-in generation; tokenizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from preheat_server import hardware
from preheat_server.engine import EngineConfig, LLMEngine, SamplingParams
from preheat_server.models import BUILTIN_MODELS, ModelConfig, load_model
from preheat_server.models.builtin import (
    builtin_config,
    ensure_builtin,
    random_weights,
    save_hf_folder,
    train_tokenizer,
    write_builtin,
)
from preheat_server.models.cpu_gemm import (
    PackedLinear,
    bf16_prepack_supported,
    pack_linear,
    prepack_available,
)
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers", reason="transformers is the dev-extra reference")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # 2 shared cores: extra OpenMP threads only spin


@pytest.fixture(scope="module")
def tokenizer_obj():
    return train_tokenizer(1024, 1234)


def variant_folder(tmp: Path, tok, **changes) -> Path:
    cfg = dataclasses.replace(builtin_config("tiny", tok.token_to_id("<|endoftext|>")), **changes)
    shards = changes.pop("num_shards", 1) if "num_shards" in changes else 1
    save_hf_folder(tmp, cfg, random_weights(cfg, seed=77), tok, shards)
    return tmp


def hf_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


PROMPT = [17, 400, 23, 999, 5, 61, 62, 63, 300, 301, 7, 8, 9, 10, 500, 600, 700, 800, 900, 1000]


def test_logits_match_transformers_on_builtin_tiny():
    loaded = load_model("tiny", device="cpu", precision="fp32")
    ours = loaded.model.forward_dense(torch.tensor([PROMPT]))[0]
    ref = hf_logits(loaded.path, PROMPT)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize(
    "changes",
    [
        {"tie_word_embeddings": True, "num_key_value_heads": 1},  # tied, MQA
        {"num_key_value_heads": 4, "attention_bias": True},  # plain MHA with biases
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
         "rope_theta": 500000.0},
    ],
    ids=["tied-mqa", "mha-bias", "llama3-rope"],
)
def test_logits_match_transformers_on_variants(tmp_path, tokenizer_obj, changes):
    folder = variant_folder(tmp_path, tokenizer_obj, **changes)
    loaded = load_model(str(folder), device="cpu", precision="fp32")
    ids = PROMPT * 4  # 80 tokens: past the llama3 original context of 64
    ref = hf_logits(folder, ids)
    torch.testing.assert_close(loaded.model.forward_dense(torch.tensor([ids]))[0], ref, rtol=1e-4, atol=1e-4)
    # The engine's paged path (chunked prefill through block tables) gives the same greedy tokens.
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=32, max_num_batched_tokens=24))
    out = engine.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))[0]
    assert out == [int(ref[-1].argmax())]


@pytest.mark.parametrize("changes", [{}, {"num_key_value_heads": 4, "attention_bias": True}], ids=["gqa", "mha-bias"])
def test_fused_projections_equal_the_unfused_model(tmp_path, tokenizer_obj, changes):
    """q/k/v and gate/up fused at load time: same logits, same greedy tokens, same bytes, HF names on disk."""
    folder = variant_folder(tmp_path, tokenizer_obj, **changes)
    # prepack=False: this test reads the fused weights, which oneDNN's reordered copies hide.
    fused = load_model(str(folder), device="cpu", precision="fp32", prepack=False)
    plain = load_model(str(folder), device="cpu", precision="fp32", fuse=False, prepack=False)
    attn, mlp = fused.model.model.layers[0].self_attn, fused.model.model.layers[0].mlp
    assert fused.model.is_fused and not plain.model.is_fused
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj")
    cfg = fused.config
    assert attn.qkv_proj.weight.shape == ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim,
                                          cfg.hidden_size)
    assert (attn.qkv_proj.bias is not None) == bool(changes.get("attention_bias"))
    plain_attn = plain.model.model.layers[0].self_attn
    assert torch.equal(attn.qkv_proj.weight, torch.cat([plain_attn.q_proj.weight, plain_attn.k_proj.weight,
                                                        plain_attn.v_proj.weight]))
    assert fused.weight_bytes == plain.weight_bytes
    ids = torch.tensor([PROMPT * 3])
    a, b = fused.model.forward_dense(ids), plain.model.forward_dense(ids)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    prompts = [PROMPT, PROMPT[:7], PROMPT * 2]
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    assert (LLMEngine(fused, EngineConfig(num_kv_blocks=32)).generate(prompts, greedy)
            == LLMEngine(plain, EngineConfig(num_kv_blocks=32)).generate(prompts, greedy))
    # The folder on disk keeps Hugging Face's names: transformers still loads it and agrees.
    torch.testing.assert_close(a[0], hf_logits(folder, PROMPT * 3), rtol=1e-4, atol=1e-4)


# A Zen 3 / Haswell-class CPU: AVX2 and FMA, no AVX-512, no AMX, no AVX-NE-CONVERT. PREHEAT_CPU_FLAGS narrows
# the detected flags to these, so the kernels such a CPU gets are chosen and checked on any machine.
AVX2_ONLY = "avx avx2 fma f16c sse4_2"


@pytest.mark.parametrize("cpu", ["this-cpu", "avx2-only"])
@pytest.mark.parametrize("changes", [{}, {"tie_word_embeddings": True, "attention_bias": True}],
                         ids=["untied", "tied-bias"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cpu_linears_follow_the_cpu_and_equal_the_plain_ones(tmp_path, tokenizer_obj, monkeypatch, changes,
                                                             precision, cpu):
    """The CPU default: oneDNN-prepacked linears where the CPU has oneDNN's path for the precision (fp32:
    any x86-64; bf16: AVX-512 BW/VL/DQ or AVX-NE-CONVERT), aten's plain ones otherwise. Either way the
    same logits within GEMM rounding, the same greedy tokens and weight bytes as an unpacked load, and
    the kernel report names what was chosen; a tied lm_head stays the embedding's plain table."""
    if not prepack_available():
        pytest.fail("this torch build has no oneDNN linear ops; the CPU default cannot be tested")
    if cpu == "avx2-only":
        monkeypatch.setenv("PREHEAT_CPU_FLAGS", AVX2_ONLY)
    folder = variant_folder(tmp_path, tokenizer_obj, **changes)
    chosen = load_model(str(folder), device="cpu", precision=precision)
    plain = load_model(str(folder), device="cpu", precision=precision, prepack=False)
    # fp32 packs on any x86-64; without AVX-512 BW/VL/DQ or AVX-NE-CONVERT, bf16 must take the fallback.
    packs = precision == "fp32" or (cpu == "this-cpu" and bf16_prepack_supported(hardware.cpu_flags()))
    layer = chosen.model.model.layers[0]
    kind = PackedLinear if packs else torch.nn.Linear
    assert type(layer.self_attn.qkv_proj) is kind and type(layer.mlp.down_proj) is kind
    assert (layer.self_attn.qkv_proj.bias is not None) == bool(changes.get("attention_bias"))
    tied = bool(changes.get("tie_word_embeddings"))
    assert set(chosen.kernels.kernels) == ({"onednn_prepacked"} | ({"aten"} if tied else set())
                                           if packs else {"aten"})
    assert (type(chosen.model.lm_head) is torch.nn.Linear) == (tied or not packs)
    if tied:
        assert chosen.model.lm_head.weight is chosen.model.model.embed_tokens.weight
    assert chosen.weight_bytes == plain.weight_bytes > 0
    ids = torch.tensor([PROMPT * 3])
    a, b = chosen.model.forward_dense(ids), plain.model.forward_dense(ids)
    tol = 1e-4 if precision == "fp32" else 5e-2
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    if precision == "fp32" or not packs:
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        prompts = [PROMPT, PROMPT[:7], PROMPT * 2]
        greedy = SamplingParams(max_tokens=10, ignore_eos=True)
        assert (LLMEngine(chosen, EngineConfig(num_kv_blocks=32)).generate(prompts, greedy)
                == LLMEngine(plain, EngineConfig(num_kv_blocks=32)).generate(prompts, greedy))


@pytest.mark.parametrize(("flags", "prepack", "compute"), [
    ("avx avx2 fma f16c", False, "reference"),                         # Zen 3, Haswell .. Comet Lake
    ("avx2 fma avx512f avx512bw avx512vl avx512dq", True, "emulated"),  # Skylake-X, Ice Lake
    ("avx2 fma avx_ne_convert avx_vnni", True, "emulated"),            # Sierra Forest, Arrow Lake
    ("avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16", True, "native"),  # Zen 4, Cooper Lake
    ("avx2 avx512bw avx512vl avx512dq amx_bf16 amx_tile", True, "native"),   # Sapphire Rapids
])
def test_bf16_kernel_choice_follows_the_cpu_flags(flags, prepack, compute):
    """oneDNN's bf16 condition (its own refusal message) and whether bf16 arithmetic is native, per CPU."""
    from preheat_server.models.kernels import bf16_compute

    assert bf16_prepack_supported(frozenset(flags.split())) is prepack
    assert bf16_compute(frozenset(flags.split())) == compute


def test_kernel_report_says_when_bf16_is_slower_than_fp32(monkeypatch):
    """On a CPU without native bf16, a bf16 load still works, and its start-up line says it is slower."""
    monkeypatch.setenv("PREHEAT_CPU_FLAGS", AVX2_ONLY)
    loaded = load_model("tiny", device="cpu", precision="bf16")
    report = loaded.kernels
    assert report.bf16_compute == "reference" and report.main_kernel == "aten"
    assert "slower than fp32" in report.line() and "avx2" in report.line()
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    fp32 = load_model("tiny", device="cpu", precision="fp32").kernels
    assert fp32.main_kernel == "onednn_prepacked" and fp32.warning is None


def test_pack_linear_declines_what_onednn_should_not_run():
    """fp16 and int weights stay plain (None); a packed row does not depend on the rest of the batch."""
    assert pack_linear(torch.nn.Linear(64, 48).half()) is None
    lin = torch.nn.Linear(64, 48)
    twin = pack_linear(lin)
    assert twin is not None and not hasattr(twin, "weight")
    x = torch.randn(40, 64)
    with torch.inference_mode():
        torch.testing.assert_close(twin(x), lin(x), rtol=1e-5, atol=1e-5)
        assert torch.equal(twin(x)[:1], twin(x[:1]))
        assert twin(x.view(5, 8, 64)).shape == (5, 8, 48)


def test_sharded_checkpoint_loads_the_same_weights(tmp_path, tokenizer_obj):
    one = variant_folder(tmp_path / "one", tokenizer_obj)
    cfg = ModelConfig.from_hf_dict(json.loads((one / "config.json").read_text()))
    save_hf_folder(tmp_path / "sharded", cfg, random_weights(cfg, seed=77), tokenizer_obj, num_shards=3)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a = load_model(str(one), device="cpu").model.forward_dense(torch.tensor([PROMPT]))
    b = load_model(str(tmp_path / "sharded"), device="cpu").model.forward_dense(torch.tensor([PROMPT]))
    assert torch.equal(a, b)


def test_old_and_new_config_spellings_parse_alike():
    base = builtin_config("tiny").to_hf_dict()
    old = dict(base, rope_theta=500000.0, torch_dtype="bfloat16")
    new = {k: v for k, v in base.items() if k not in ("rope_theta", "torch_dtype", "rope_scaling")}
    new.update(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, dtype="bfloat16")
    a, b = ModelConfig.from_hf_dict(old), ModelConfig.from_hf_dict(new)
    assert (a.rope_theta, a.dtype, a.rope_scaling) == (b.rope_theta, b.dtype, b.rope_scaling) == (
        500000.0, torch.bfloat16, None)
    scaled = ModelConfig.from_hf_dict(dict(new, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 10000.0}))
    assert scaled.rope_scaling == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(model_type="gpt2"), "model_type"),
        (lambda d: d.pop("hidden_size"), "hidden_size"),
        (lambda d: d.update(num_key_value_heads=3), "multiple"),
        (lambda d: d.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope scaling"),
    ],
)
def test_bad_configs_are_rejected_with_the_reason(mutate, match):
    d = builtin_config("tiny").to_hf_dict()
    mutate(d)
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(d)


def test_load_model_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="built-in"):
        load_model(str(tmp_path / "missing"), device="cpu")
    with pytest.raises(ValueError, match="precision"):
        load_model("tiny", device="cpu", precision="fp8")
    with pytest.raises(ValueError, match="fp16 is for CUDA"):
        load_model("tiny", device="cpu", precision="fp16")
    with pytest.raises(ValueError, match="device"):
        load_model("tiny", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            load_model("tiny", device="cuda")


def test_builtin_generation_is_deterministic_and_cached(tmp_path, monkeypatch):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        write_builtin("tiny", tmp_path / d)
    wa, wb = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    monkeypatch.setenv("PREHEAT_CACHE", str(tmp_path / "cache"))
    folder = ensure_builtin("tiny")
    assert folder.parent == tmp_path / "cache" / "models"
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_builtin("tiny") == folder  # second call reuses, does not regenerate
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert set(BUILTIN_MODELS) == {"tiny", "small"}


def test_loaded_model_fields():
    loaded = load_model("tiny", device="cpu", precision="bf16", prepack=False)  # counts parameters below
    assert loaded.name == "tiny" and loaded.precision == "bf16" and loaded.dtype == torch.bfloat16
    assert loaded.device == torch.device("cpu") and loaded.load_seconds > 0
    n_params = sum(p.numel() for p in loaded.model.parameters())
    assert loaded.weight_bytes == 2 * n_params
    assert loaded.config.vocab_size == loaded.tokenizer.vocab_size == 1024


def test_tokenizer_round_trip_bytes_and_chat_template():
    tok = load_model("tiny", device="cpu").tokenizer
    text = "Warm pool café 日本語 🚀 and the model server"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")
    # Streaming token by token: the concatenated bytes are the text even when a token splits a character.
    assert b"".join(tok.decode_bytes([i]) for i in ids).decode("utf-8") == text
    assert any(not _is_complete_utf8(tok.decode_bytes([i])) for i in tok.encode("🚀😀東京"))
    chat = tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    im_end = tok.encode("<|im_end|>")
    assert len(im_end) == 1 and im_end[0] in tok.stop_token_ids
    assert tok.decode_bytes(im_end) == b""  # special tokens are not text
    assert tok.eos_token_id == tok.encode("<|endoftext|>")[0]


def _is_complete_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
