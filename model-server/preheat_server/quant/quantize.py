"""Weight-only quantization: int8 per output channel and int4 group-wise (asymmetric), in pure torch.

Matmuls use aten's packed kernels where this torch build has them for the device
(``_weight_int8pack_mm`` and ``_weight_int4pack_mm_for_cpu`` on CPU, ``_weight_int4pack_mm`` on CUDA);
otherwise the weight is dequantized on the fly (slower, same numbers). Embedding tables are quantized
too (a lookup dequantizes only the rows it reads), because on small vocabularies-heavy models they
are a large share of the weight bytes. The formats follow gpt-fast's quantize.py.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

INT4_GROUP_SIZE = 128
_INT4_INNER_K_TILES = 2


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: w ≈ q * scale[:, None]."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return q, scale


def quantize_int4_groupwise(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of ``group_size`` inputs.

    Returns (q [N, K] int32 in 0..15, scales_and_zeros [K/group, N, 2] fp32) with
    w ≈ (q - 8) * scale + zero, the convention of aten's int4pack kernels.
    """
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of the int4 group size {group_size}")
    wg = w.float().reshape(n, k // group_size, group_size)
    mx, mn = wg.amax(dim=2, keepdim=True), wg.amin(dim=2, keepdim=True)
    scale = (mx - mn).clamp(min=1e-8) / 15.0
    q = torch.clamp(torch.round((wg - mn) / scale), 0, 15).to(torch.int32).reshape(n, k)
    zero = mn + scale * 8.0
    sz = torch.stack([scale.squeeze(2), zero.squeeze(2)], dim=-1).transpose(0, 1).contiguous()
    return q, sz


def dequantize_int4(q: torch.Tensor, sz: torch.Tensor, group_size: int) -> torch.Tensor:
    scale = sz[..., 0].t().repeat_interleave(group_size, dim=1)
    zero = sz[..., 1].t().repeat_interleave(group_size, dim=1)
    return (q.float() - 8.0) * scale.float() + zero.float()


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    q = q.to(torch.uint8)
    return (q[:, ::2] << 4) | q[:, 1::2]


def _unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    return torch.stack([p >> 4, p & 0xF], dim=-1).reshape(p.shape[0], -1)


def _has_op(name: str) -> bool:
    return hasattr(torch.ops.aten, name)


def cpu_kernel_dtype(act_dtype: torch.dtype) -> torch.dtype:
    """The activation dtype aten's int8/int4 CPU kernels are fed for a model running in ``act_dtype``.

    Their fp32-activation path is scalar on x86 builds: measured on a 1536x576 layer, int8 0.52 ms with
    fp32 activations vs 0.05 ms with bf16 (int4 1.5 vs 0.06 ms), at 32 rows 17 vs 0.8 ms, with torch's
    AVX2 and AVX-512 kernels alike; only without a vectorised build (capability DEFAULT) is bf16 not
    faster. So an fp32 model's quantized layers round their input to bf16 there (8 bits of mantissa,
    finer than the int8/int4 weights' own step) and give fp32 back. ``PREHEAT_QUANT_ACTIVATIONS=fp32``
    keeps the exact fp32 path."""
    if act_dtype != torch.float32 or os.environ.get("PREHEAT_QUANT_ACTIVATIONS", "auto") == "fp32":
        return act_dtype
    return torch.bfloat16 if torch.backends.cpu.get_cpu_capability() != "DEFAULT" else act_dtype


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T (+ bias); q int8 [N, K], scale per output channel."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, act_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        if q.data_ptr() % 64:  # a view into a loaded file: the AVX-512 kernel crashes on unaligned rows
            q = q.clone()
        self.register_buffer("weight", q)
        self.register_buffer("scales", scale.to(act_dtype))
        self.bias = None if bias is None else nn.Parameter(bias.to(act_dtype), requires_grad=False)
        self.use_packed = q.device.type == "cpu" and _has_op("_weight_int8pack_mm")
        self.act_dtype = act_dtype
        self.kernel_dtype = cpu_kernel_dtype(act_dtype) if self.use_packed else act_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.use_packed:
            kd = self.kernel_dtype if x.dtype == torch.float32 else x.dtype
            y = torch.ops.aten._weight_int8pack_mm(x2.to(kd), self.weight, self.scales.to(kd)).to(x.dtype)
        else:
            y = F.linear(x2, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """Group-wise int4 weights in the packed layout of aten's int4 matmul for this device."""

    def __init__(self, w: torch.Tensor | None, bias: torch.Tensor | None, act_dtype: torch.dtype, group_size: int,
                 quantized: tuple[torch.Tensor, torch.Tensor] | None = None):
        """From float weights ``w``, or from ``quantized`` = (q [N, K] 0..15, scales_and_zeros) (the cache)."""
        super().__init__()
        q, sz = quantized if quantized is not None else quantize_int4_groupwise(w, group_size)
        n, k = q.shape
        self.in_features, self.out_features, self.group_size = k, n, group_size
        dev = q.device
        self.mode = "dequant"
        packed = None
        try:
            if dev.type == "cpu" and _has_op("_weight_int4pack_mm_for_cpu"):
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, _INT4_INNER_K_TILES)
                self.mode = "cpu"
            elif dev.type == "cuda" and _has_op("_weight_int4pack_mm") and n % 8 == 0 and k % 256 == 0:
                packed = torch.ops.aten._convert_weight_to_int4pack(_pack_nibbles(q), _INT4_INNER_K_TILES)
                self.mode = "cuda"
        except RuntimeError:
            packed, self.mode = None, "dequant"  # kernel refuses this shape: dequantize instead
        if packed is None:
            packed = _pack_nibbles(q)
        self.register_buffer("weight", packed)
        # bf16 scales/zeros as in gpt-fast: 4 bytes per group of 128 weights.
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.to(act_dtype), requires_grad=False)
        self.act_dtype = act_dtype
        self.kernel_dtype = cpu_kernel_dtype(act_dtype) if self.mode == "cpu" else act_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.mode == "cpu":
            kd = self.kernel_dtype if x.dtype == torch.float32 else x.dtype
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(kd), self.weight, self.group_size, self.scales_and_zeros.to(kd)
            ).to(x.dtype)
        elif self.mode == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(
                x2.to(torch.bfloat16), self.weight, self.group_size, self.scales_and_zeros
            ).to(x.dtype)
        else:
            w = dequantize_int4(_unpack_nibbles(self.weight), self.scales_and_zeros, self.group_size)
            y = F.linear(x2, w.to(x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


class Int8Embedding(nn.Module):
    """Row-quantized table; can share its buffers with a tied ``Int8Linear`` lm_head."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, act_dtype: torch.dtype):
        super().__init__()
        self.register_buffer("weight", q)
        self.register_buffer("scales", scale.to(act_dtype))
        self.act_dtype = act_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids].to(self.act_dtype) * self.scales[ids].to(self.act_dtype)[..., None]


class Int4Embedding(nn.Module):
    def __init__(self, w: torch.Tensor | None, act_dtype: torch.dtype, group_size: int,
                 quantized: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        q, sz = quantized if quantized is not None else quantize_int4_groupwise(w, group_size)
        self.register_buffer("weight", _pack_nibbles(q))
        # [V, K/group, 2]: row-major so a lookup gathers only its rows' scales.
        self.register_buffer("scales_and_zeros", sz.transpose(0, 1).contiguous().to(torch.bfloat16))
        self.group_size, self.act_dtype = group_size, act_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        q = _unpack_nibbles(self.weight[flat]).float()
        sz = self.scales_and_zeros[flat].float()
        g = self.group_size
        scale = sz[..., 0].repeat_interleave(g, dim=1)
        zero = sz[..., 1].repeat_interleave(g, dim=1)
        out = (q - 8.0) * scale + zero
        return out.to(self.act_dtype).reshape(*ids.shape, -1)


def int4_group_size(k: int, group_size: int = INT4_GROUP_SIZE) -> int:
    """The largest of group_size, group_size/2, ... (down to 32, the kernels' smallest) dividing ``k``.

    Every matrix must split into whole groups: SmolLM2's hidden size 576 takes 64 where 128 is asked.
    """
    g = group_size
    while g > 32 and k % g:
        g //= 2
    if k % g:
        raise ValueError(f"in_features {k} is not a multiple of 32: no int4 group size divides it")
    return g


def quantize_model(model: nn.Module, precision: str, group_size: int = INT4_GROUP_SIZE,
                   store: dict[str, torch.Tensor] | None = None, restore: bool = False,
                   act_dtype: torch.dtype | None = None) -> nn.Module:
    """Replace every nn.Linear and the token embedding in place with the int8/int4 modules.

    ``store``: filled with the quantized tensors by module name (what the on-disk cache keeps).
    ``restore``: build the modules from ``store`` instead (the model may then live on the meta device).
    With int4, a tied embedding / lm_head table stays int8 (per row), as llama.cpp keeps a tied output
    table above 4 bits (Q6_K in its Q4_0 files): it is both the first and the last layer, where 4-bit
    error costs most, and on small-vocabulary models a large share of the weights.
    """
    if precision not in ("int8", "int4"):
        raise ValueError(f"quantize_model: precision must be int8 or int4, got {precision!r}")
    if restore and store is None:
        raise ValueError("quantize_model: restore needs the stored tensors")
    if act_dtype is None:   # fp32 activations on CPU (the packed kernels take fp32), bf16 on CUDA
        act_dtype = torch.float32
        for p in model.parameters():
            act_dtype = torch.bfloat16 if p.device.type == "cuda" else torch.float32
            break
    cfg = getattr(model, "config", None)
    tied = bool(cfg and cfg.tie_word_embeddings)

    def int8(name: str, w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if restore:
            return store[f"{name}.q"], store[f"{name}.scales"]
        q, s = quantize_int8_per_channel(w)
        if store is not None:
            store[f"{name}.q"], store[f"{name}.scales"] = q, s
        return q, s

    def int4(name: str, w: torch.Tensor | None, k: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        g = int4_group_size(k, group_size)
        if restore:
            return (_unpack_nibbles(store[f"{name}.q4"]).to(torch.int32), store[f"{name}.scales_and_zeros"]), g
        q, sz = quantize_int4_groupwise(w, g)
        if store is not None:
            store[f"{name}.q4"], store[f"{name}.scales_and_zeros"] = _pack_nibbles(q), sz.to(torch.bfloat16)
        return (q, sz), g

    head_int8 = precision == "int8" or tied
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            w = None if restore else child.weight.data
            bias = None
            if child.bias is not None:
                bias = store[f"{name}.bias"] if restore else child.bias.data
                if store is not None and not restore:
                    store[f"{name}.bias"] = bias
            if precision == "int8" or (head_int8 and name == "lm_head"):
                q, s = int8(name, w)
                setattr(parent, child_name, Int8Linear(q, s, bias, act_dtype))
            else:
                quantized, g = int4(name, w, child.in_features)
                setattr(parent, child_name, Int4Linear(None, bias, act_dtype, g, quantized=quantized))

    emb = model.model.embed_tokens  # type: ignore[union-attr]
    if isinstance(emb, nn.Embedding):
        w = None if restore else emb.weight.data
        if tied and isinstance(model.lm_head, Int8Linear):
            # Tied: the embedding reads the lm_head's int8 rows; one copy of the table in memory.
            head = model.lm_head
            model.model.embed_tokens = Int8Embedding(head.weight, head.scales, act_dtype)
        elif precision == "int8":
            q, s = int8("model.embed_tokens", w)
            model.model.embed_tokens = Int8Embedding(q, s, act_dtype)
        else:
            quantized, g = int4("model.embed_tokens", w, emb.embedding_dim)
            model.model.embed_tokens = Int4Embedding(None, act_dtype, g, quantized=quantized)
    return model
