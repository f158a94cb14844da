"""Which CPU kernels this machine can run, and which ones a loaded model actually uses.

The choice starts from the CPU's flags (``preheat_server.hardware``), never from one CPU family:
- oneDNN prepacks bf16 weights only with avx512bw + avx512vl + avx512dq or avx_ne_convert (its own
  refusal says so); elsewhere bf16 linears stay aten's plain ones, which still run, slower.
- bf16 arithmetic is native with avx512_bf16 or amx_bf16; with only the AVX-512 base (or avx_ne_convert)
  oneDNN emulates the bf16 dot product, and with neither aten falls back to a reference GEMM. In both of
  those cases a bf16 GEMM is slower than an fp32 one, so the start-up line says so.
- int8 and int4 weight-only kernels are aten ops present in every x86 build, vectorised for bf16 input
  only: an fp32 model feeds them bf16 where torch runs AVX2 or AVX-512 code (``_bf16in`` in the report;
  ``quant.cpu_kernel_dtype`` says why); where an op or a shape is missing, the layer dequantizes instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torch import nn

from .. import hardware
from ..quant.quantize import Int4Linear, Int8Linear
from .cpu_gemm import PackedLinear, bf16_prepack_supported


def bf16_compute(flags: frozenset[str] | None = None) -> str:
    """``native`` (bf16 dot products in hardware), ``emulated`` (oneDNN, slower than fp32) or ``reference``."""
    flags = hardware.cpu_flags() if flags is None else flags
    if flags & {"avx512_bf16", "amx_bf16"}:
        return "native"
    return "emulated" if bf16_prepack_supported(flags) else "reference"


def _bf16_input(m: Int8Linear | Int4Linear) -> str:
    """``_bf16in`` where an fp32 model's quantized layer feeds the kernel bf16 (quant.cpu_kernel_dtype)."""
    return "_bf16in" if m.kernel_dtype != m.act_dtype else ""


def linear_kernels(model: nn.Module) -> dict[str, int]:
    """How many linear layers run on each kernel, read from the loaded modules themselves."""
    counts: Counter[str] = Counter()
    for m in model.modules():
        if isinstance(m, PackedLinear):
            counts["onednn_prepacked"] += 1
        elif isinstance(m, Int8Linear):
            counts["int8pack" + _bf16_input(m) if m.use_packed else "int8_dequant"] += 1
        elif isinstance(m, Int4Linear):
            counts[f"int4pack_{m.mode}" + _bf16_input(m) if m.mode != "dequant" else "int4_dequant"] += 1
        elif isinstance(m, nn.Linear):
            counts["aten"] += 1
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class KernelReport:
    """What the server says at start-up about the kernels it runs (a log line and an info metric)."""

    device: str
    precision: str
    kernels: dict[str, int]
    cpu_model: str
    cpu_flags: tuple[str, ...]
    bf16_compute: str

    @property
    def main_kernel(self) -> str:
        """The kernel that runs most linear layers (the metric's label)."""
        return max(self.kernels, key=self.kernels.__getitem__) if self.kernels else "none"

    @property
    def warning(self) -> str | None:
        if self.device == "cpu" and self.precision == "bf16" and self.bf16_compute != "native":
            return (f"no native bf16 GEMM on this CPU ({self.bf16_compute}; no avx512_bf16/amx_bf16): slower "
                    "than fp32 here; bf16 only halves weight memory")
        return None

    def line(self) -> str:
        used = ", ".join(f"{k} x{n}" for k, n in self.kernels.items()) or "none"
        text = (f"kernels: {self.precision} on {self.device}, linears {used}; CPU {self.cpu_model} "
                f"[{' '.join(self.cpu_flags) or 'no AVX2/AVX-512/AMX flags'}], bf16 {self.bf16_compute}")
        return f"{text}; {self.warning}" if self.warning else text


def report(model: nn.Module, device: str, precision: str) -> KernelReport:
    return KernelReport(device=device, precision=precision, kernels=linear_kernels(model),
                        cpu_model=hardware.cpu_model(), cpu_flags=tuple(hardware.relevant_flags()),
                        bf16_compute=bf16_compute())
