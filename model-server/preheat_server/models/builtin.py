"""Built-in models (``tiny``, ``small``): generated from a seed, saved as Hugging Face folders in the cache.

A fresh machine serves without any download: the weights are seeded random tensors and the tokenizer
is a byte-level BPE trained with `tokenizers` on a corpus generated here from a seeded RNG. The
folder is written once (atomically) under ``$PREHEAT_CACHE/models`` and then loaded through the same
loader as any Hugging Face folder, so that path is what every test and the cluster exercise.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from .config import ModelConfig
from .tokenizer import CHAT_END, CHAT_START, END_OF_TEXT

# Bump when the generation recipe changes, so stale cached folders are not reused.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class BuiltinSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str
    num_shards: int
    seed: int


BUILTIN_SPECS: dict[str, BuiltinSpec] = {
    # For tests and the closed-loop cluster: milliseconds per step on one core.
    "tiny": BuiltinSpec(1024, 128, 384, 2, 4, 2, 1024, False, "float32", 1, 1234),
    # For benchmarks: ~45M parameters, big enough that matmuls (not Python) dominate a step.
    "small": BuiltinSpec(4096, 768, 2048, 6, 12, 4, 2048, False, "bfloat16", 2, 5678),
}
BUILTIN_MODELS: tuple[str, ...] = tuple(BUILTIN_SPECS)


def cache_root() -> Path:
    return Path(os.environ.get("PREHEAT_CACHE") or Path.home() / ".cache" / "preheat") / "models"


_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["qu", "th", "sh", "ch", "ng"]
_WORDS = ["the", "a", "of", "to", "and", "in", "is", "for", "on", "that", "with", "as", "by", "at", "from", "it", "this", "be", "are", "was", "or", "an", "which", "model", "server", "replica", "warm", "pool", "lead", "time", "cold", "start", "token", "request", "batch", "cache", "block", "prefix", "forecast", "policy", "scale", "kubernetes", "pod", "node", "latency", "throughput", "memory", "queue", "traffic", "hour", "minute", "second", "load", "decode", "prefill"]
_INTL = ["café", "naïve", "über", "Straße", "año", "façade", "日本語", "東京", "こんにちは", "Привет", "мир",
         "γεια", "世界", "😀", "🚀", "✓", "€", "°C", "→"]


def builtin_corpus(seed: int, num_lines: int = 6000) -> list[str]:
    """Deterministic text: common words, pseudo-words, numbers, code and non-ASCII characters."""
    rng = random.Random(seed)
    pseudo = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    lines = []
    for _ in range(num_lines):
        words = []
        for _ in range(rng.randint(5, 20)):
            r = rng.random()
            if r < 0.5:
                words.append(rng.choice(_WORDS))
            elif r < 0.85:
                words.append(rng.choice(pseudo))
            elif r < 0.93:
                words.append(str(rng.randint(0, 10 ** rng.randint(1, 5))))
            else:
                words.append(rng.choice(_INTL))
        sentence = " ".join(words)
        if rng.random() < 0.1:
            sentence = f"def {rng.choice(pseudo)}(x):\n    return x * {rng.randint(2, 9)}"
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ",", ":"]))
    return lines


def train_tokenizer(vocab_size: int, seed: int) -> HFTokenizer:
    """Byte-level BPE (GPT-2 style) with the end-of-text and ChatML markers as special tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT, CHAT_START, CHAT_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(builtin_corpus(seed), trainer=trainer)
    return tok


def _random_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights scaled so activations and logits have O(1) spread (clear greedy argmaxes)."""
    g = torch.Generator().manual_seed(seed)
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qn, kvn = cfg.num_attention_heads * d, cfg.num_key_value_heads * d

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) / in_f**0.5

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, h, generator=g)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        w[p + "self_attn.q_proj.weight"] = lin(qn, h)
        w[p + "self_attn.k_proj.weight"] = lin(kvn, h)
        w[p + "self_attn.v_proj.weight"] = lin(kvn, h)
        w[p + "self_attn.o_proj.weight"] = lin(h, qn)
        w[p + "mlp.gate_proj.weight"] = lin(i, h)
        w[p + "mlp.up_proj.weight"] = lin(i, h)
        w[p + "mlp.down_proj.weight"] = lin(h, i)
        if cfg.attention_bias:
            for proj, size in (("q", qn), ("k", kvn), ("v", kvn)):
                w[p + f"self_attn.{proj}_proj.bias"] = 0.1 * torch.randn(size, generator=g)
            if cfg.model_type == "llama":
                w[p + "self_attn.o_proj.bias"] = 0.1 * torch.randn(h, generator=g)
        w[p + "input_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
        w[p + "post_attention_layernorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    w["model.norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = lin(cfg.vocab_size, h) * 2.0
    return w


def builtin_config(name: str, eos_token_id: int = 0) -> ModelConfig:
    s = BUILTIN_SPECS[name]
    return ModelConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        head_dim=s.hidden_size // s.num_attention_heads,
        max_position_embeddings=s.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=s.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        eos_token_ids=(eos_token_id,),
        pad_token_id=eos_token_id,
        torch_dtype=s.torch_dtype,
    )


def save_hf_folder(folder: Path, cfg: ModelConfig, weights: dict[str, torch.Tensor], tok: HFTokenizer,
                   num_shards: int = 1) -> None:
    """Write config.json, tokenizer files and safetensors weights (sharded with an index if asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": END_OF_TEXT, "pad_token": END_OF_TEXT, "model_max_length": cfg.max_position_embeddings,
                    "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2)
    )
    weights = {k: v.to(cfg.dtype).contiguous() for k, v in weights.items()}
    if num_shards == 1:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    # Sharded like large HF checkpoints, so the index path of the loader is exercised too.
    names = list(weights)
    per = -(-len(names) // num_shards)
    index: dict[str, str] = {}
    total = 0
    for s in range(num_shards):
        fname = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {k: weights[k] for k in names[s * per : (s + 1) * per]}
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        index.update(dict.fromkeys(part, fname))
        total += sum(t.numel() * t.element_size() for t in part.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2)
    )


def random_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights for any config (tests use it for variants: tied, GQA ratios, rope scaling)."""
    return _random_weights(cfg, seed)


def write_builtin(name: str, folder: Path) -> None:
    """Write the Hugging Face folder for built-in ``name`` into ``folder``."""
    spec = BUILTIN_SPECS[name]
    tok = train_tokenizer(spec.vocab_size, spec.seed)
    cfg = builtin_config(name, tok.token_to_id(END_OF_TEXT))
    save_hf_folder(folder, cfg, _random_weights(cfg, spec.seed), tok, spec.num_shards)


def ensure_builtin(name: str) -> Path:
    """The cached folder of built-in ``name``, generating it if missing (safe under concurrent callers)."""
    if name not in BUILTIN_SPECS:
        raise ValueError(f"unknown built-in model {name!r}; built-ins: {', '.join(BUILTIN_MODELS)}")
    root = cache_root()
    # The spec is part of the name: a changed recipe never reuses a stale folder.
    digest = hashlib.sha256(repr((RECIPE_VERSION, BUILTIN_SPECS[name])).encode()).hexdigest()[:8]
    folder = root / f"{name}-{digest}"
    if (folder / "config.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        write_builtin(name, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like pip's
        for f in tmp.iterdir():
            f.chmod(0o644)
        try:
            os.rename(tmp, folder)  # atomic: readers see a complete folder or none
        except OSError:
            if not (folder / "config.json").is_file():  # not a lost race: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
