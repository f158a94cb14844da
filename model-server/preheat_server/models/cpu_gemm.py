"""Which kernel runs a float linear layer on CPU: oneDNN on a weight reordered once at load.

Why: ``F.linear`` on CPU hands the plain [out, in] weight to MKL's sgemm at every call. At decode batch
sizes that is the server's bottleneck: on the 2-core benchmark machine (Zen 4) the `small` model's six
layers of GEMMs took 24 ms at 32 rows (101 GFLOP/s) and 11 ms at one row, against 13 ms and 6 ms for
oneDNN's matmul on the same fp32 weights reordered once into its blocked layout (bf16: 10.8 -> 7.1 ms at
32 rows). This is what PyTorch's own inductor freezing pass and vLLM's CPU backend do; the numerics are
fp32 (bf16) GEMM either way, and a row's result does not depend on the other rows of the batch.

The ops (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``) are internal to PyTorch, so
they are used only where they exist, where the CPU has oneDNN's path for the dtype (bf16 needs AVX-512 BW/VL/DQ
or AVX-NE-CONVERT; fp32 runs on any x86-64) and a probe product agrees with ``F.linear``; otherwise the layer
stays a plain ``nn.Linear``. ``kernels.report`` says at start-up which layers got which kernel. The reordered weight is an opaque oneDNN tensor: it is kept as a plain
attribute, not a parameter, so state dicts and byte counts see only real tensors (the loader counts
weight bytes before packing; the packed copy replaces the original, it does not add to it).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from .. import hardware

log = logging.getLogger(__name__)

# Batch-size hint for oneDNN's weight layout. Measured: a layout picked for 32 rows runs 1-512 rows as
# fast as one picked for each (a 1-row layout lost 20 % at 32 rows).
_ROWS_HINT = 32
_DTYPES = (torch.float32, torch.bfloat16)
# oneDNN's own condition for its bf16 path (its refusal reads "bf16 path needs the cpu support
# avx_ne_convert or avx512bw, avx512vl and avx512dq").
_BF16_PREPACK_BASE = frozenset({"avx512bw", "avx512vl", "avx512dq"})


def bf16_prepack_supported(flags: frozenset[str] | None = None) -> bool:
    """Whether oneDNN can reorder and run bf16 linear weights on this CPU (from its flags)."""
    flags = hardware.cpu_flags() if flags is None else flags
    return "avx_ne_convert" in flags or flags >= _BF16_PREPACK_BASE


def prepack_available() -> bool:
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight") and hasattr(
        ops, "_linear_pointwise")


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` through oneDNN with W reordered once (CPU, fp32 or bf16)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.packed_weight = packed  # opaque oneDNN tensor: deliberately not a parameter or buffer
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self.packed_weight, self.bias, "none",
                                               [], "")
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linear(lin: nn.Linear) -> PackedLinear | None:
    """The packed twin of ``lin``, or None when oneDNN cannot take it or disagrees with F.linear."""
    w = lin.weight.data
    if w.device.type != "cpu" or w.dtype not in _DTYPES or not prepack_available():
        return None
    if w.dtype == torch.bfloat16 and not bf16_prepack_supported():
        return None  # the CPU lacks oneDNN's bf16 path: aten's plain bf16 linear runs instead
    bias = None if lin.bias is None else lin.bias.data
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, _ROWS_HINT)
        twin = PackedLinear(packed, bias, w.shape[1], w.shape[0])
        probe = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
        want, got = F.linear(probe, w, bias).float(), twin(probe).float()
    except RuntimeError as e:
        log.warning("oneDNN prepacking refused a %s linear %s: %s", w.dtype, tuple(w.shape), e)
        return None
    tol = 1e-4 if w.dtype == torch.float32 else 2e-2
    if not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max().clamp(min=1.0))):
        log.warning("oneDNN prepacked linear %s disagrees with F.linear; keeping the plain one", tuple(w.shape))
        return None
    return twin


def prepack_linears(model: nn.Module, skip: tuple[nn.Module, ...] = ()) -> int:
    """Replace every float ``nn.Linear`` of ``model`` (except ``skip``) in place; returns how many."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and not any(child is s for s in skip):
                twin = pack_linear(child)
                if twin is not None:
                    setattr(parent, name, twin)
                    n += 1
    return n
