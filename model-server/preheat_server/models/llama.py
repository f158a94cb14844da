"""The Llama decoder in plain torch (RMSNorm, rotate-half RoPE, SwiGLU, grouped-query attention).

Module and parameter names equal Hugging Face's ``LlamaForCausalLM`` so a ``model.safetensors`` loads
without renaming. After loading, ``fuse_projections()`` concatenates q/k/v into one ``qkv_proj`` and
gate/up into one ``gate_up_proj`` (one GEMM each instead of three and two; the loader does this before
quantizing, and int8/int4 quantization is per output row, so fused quantized weights equal the
separately quantized ones). Attention does not own a KV cache: it hands q/k/v to an attention backend
(``engine.attention.PagedAttention`` reads and writes the paged KV cache through block tables;
``DenseCausalAttention`` below is the no-cache reference used for full recompute).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class AttentionBackend(Protocol):
    """Computes attention for one layer given this step's rotated q [T,H,D], k and v [T,Hkv,D]."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class DenseCausalAttention:
    """No KV cache: ``batch`` rows of equal length ``seq_len``, causal within each row."""

    def __init__(self, batch: int, seq_len: int, num_kv_groups: int):
        self.batch, self.seq_len, self.groups = batch, seq_len, num_kv_groups

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t = self.batch, self.seq_len
        h, d = q.shape[1], q.shape[2]
        qh = q.view(b, t, h, d).transpose(1, 2)
        kh = k.view(b, t, -1, d).transpose(1, 2).repeat_interleave(self.groups, dim=1)
        vh = v.view(b, t, -1, d).transpose(1, 2).repeat_interleave(self.groups, dim=1)
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        return o.transpose(1, 2).reshape(b * t, h, d)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies, with Hugging Face's ``linear`` and ``llama3`` scalings."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = config.rope_scaling
    if rs is None:
        return inv_freq
    if rs["rope_type"] == "linear":
        return inv_freq / float(rs["factor"])
    # llama3: keep high frequencies, divide low ones by factor, interpolate between.
    factor = float(rs["factor"])
    low = float(rs.get("low_freq_factor", 1.0))
    high = float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def fuse_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the concatenation of ``linears``' outputs (same dtype and device).

    The originals' storage is not kept: the fused weight is a fresh concatenated tensor.
    """
    w = torch.cat([lin.weight.data for lin in linears], dim=0)
    has_bias = linears[0].bias is not None
    if any((lin.bias is not None) != has_bias for lin in linears):
        raise ValueError("fuse_linears: all or none of the linears must have a bias")
    with torch.device("meta"):  # no wasted random init; the real tensors are assigned below
        fused = nn.Linear(w.shape[1], w.shape[0], bias=has_bias)
    fused.weight = nn.Parameter(w, requires_grad=False)
    if has_bias:
        fused.bias = nn.Parameter(torch.cat([lin.bias.data for lin in linears]), requires_grad=False)
    return fused


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as Hugging Face does, so bf16 logits stay comparable.
        # F.rms_norm is the same x * rsqrt(mean(x^2) + eps) in one kernel instead of five.
        dtype = x.dtype
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * h.to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hid, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hid, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hid, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hid, self.num_kv_heads * self.head_dim, bias=bias)
        # HF Llama puts attention_bias on o_proj as well; Qwen2 only on q/k/v.
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hid, bias=bias and config.model_type == "llama")
        self.qkv_proj: nn.Module | None = None  # set by fuse(); then q/k/v_proj are gone

    def fuse(self) -> None:
        """Replace q_proj, k_proj, v_proj by one qkv_proj (rows: q, then k, then v)."""
        if self.qkv_proj is not None:
            return
        self.qkv_proj = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        t = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        c, s = cos[:, None, :], sin[:, None, :]
        if self.qkv_proj is not None:
            # q and k heads are adjacent in the fused output: rotate them in one pass (same
            # elementwise arithmetic as rotating each), then split the heads.
            qkv = self.qkv_proj(x)
            qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)
            qk = qk * c + rotate_half(qk) * s
            q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + hkv) * d :].view(t, hkv, d)
        else:
            q = self.q_proj(x).view(t, h, d)
            k = self.k_proj(x).view(t, hkv, d)
            v = self.v_proj(x).view(t, hkv, d)
            q = q * c + rotate_half(q) * s
            k = k * c + rotate_half(k) * s
        o = backend.attend(self.layer_idx, q, k, v)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        hid, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hid, inter, bias=bias)
        self.up_proj = nn.Linear(hid, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hid, bias=bias)
        self.gate_up_proj: nn.Module | None = None  # set by fuse(); then gate/up_proj are gone

    def fuse(self) -> None:
        """Replace gate_proj and up_proj by one gate_up_proj (rows: gate, then up)."""
        if self.gate_up_proj is not None:
            return
        self.gate_up_proj = fuse_linears([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, backend):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Token-flat forward: ``input_ids`` and ``positions`` are 1-D over every token of this step."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up of every layer (after the weights are loaded, before quantizing)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    @property
    def is_fused(self) -> bool:
        return all(layer.self_attn.qkv_proj is not None for layer in self.model.layers)

    def rope_tables(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for every position, computed in fp32 (like HF) and cast once to the model dtype."""
        rc = self._rope_cache
        if rc is None or rc[0].device != device or rc[0].dtype != dtype:
            inv = rope_inv_freq(self.config)
            pos = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
            freqs = torch.outer(pos, inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            rc = (emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype))
            self._rope_cache = rc
        return rc

    def hidden_states(
        self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos_t, sin_t = self.rope_tables(x.device, x.dtype)
        cos, sin = cos_t[positions], sin_t[positions]
        for layer in self.model.layers:
            x = layer(x, cos, sin, backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] for whole sequences without any cache (the full-recompute reference)."""
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).repeat(b)
        backend = DenseCausalAttention(b, t, self.config.num_kv_groups)
        h = self.hidden_states(input_ids.reshape(-1), positions, backend)
        return self.compute_logits(h).view(b, t, -1)
