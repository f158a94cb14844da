"""Llama-family model configuration: parsed from a Hugging Face ``config.json`` (old and new spellings)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


@dataclass
class ModelConfig:
    """The shape of a Llama decoder; field names follow Hugging Face's ``LlamaConfig``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # None, or {"rope_type": "linear"|"llama3"|"default", "factor": ..., ...}
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Every id that ends generation (HF allows a list for eos_token_id).
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str = "float32"
    model_type: str = "llama"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES.get(self.torch_dtype, torch.float32)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """KV cache bytes per token = 2 × layers × kv_heads × head_dim × bytes per element."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * elem

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Parse a Hugging Face config dict; raises ValueError with the reason when it cannot be served."""
        model_type = d.get("model_type", "llama")
        if model_type not in ("llama", "mistral", "qwen2"):
            # Mistral/Qwen2 share the Llama block (Qwen2 adds q/k/v bias, read below).
            raise ValueError(f"unsupported model_type {model_type!r}: only Llama-family decoders are served")
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            layers = int(d["num_hidden_layers"])
            inter = int(d["intermediate_size"])
            vocab = int(d["vocab_size"])
        except KeyError as e:
            raise ValueError(f"config.json lacks required field {e.args[0]!r}") from None
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or hidden // heads)
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        # New transformers spell rope settings as rope_parameters={"rope_theta": ..., "rope_type": ...}.
        rope_params = d.get("rope_parameters") or {}
        rope_theta = float(rope_params.get("rope_theta", d.get("rope_theta", 10000.0)))
        rope_scaling = d.get("rope_scaling")
        if rope_params and rope_params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_scaling is not None:
            rope_scaling = dict(rope_scaling)
            rtype = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            rope_scaling["rope_type"] = rtype
            if rtype == "default":
                rope_scaling = None
            elif rtype not in ("linear", "llama3"):
                raise ValueError(f"unsupported rope scaling type {rtype!r} (supported: default, linear, llama3)")
        eos = d.get("eos_token_id")
        eos_ids = tuple(int(x) for x in eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
        dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_ids[0] if eos_ids else None,
            eos_token_ids=eos_ids,
            pad_token_id=d.get("pad_token_id"),
            torch_dtype=str(dtype).replace("torch.", ""),
            model_type=model_type,
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` that transformers' ``LlamaForCausalLM`` reads."""
        d: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.torch_dtype,
        }
        return d
