"""Weight-only int8/int4 quantization of a loaded Llama model, and a quality evaluator (``evaluate``)."""

from .quantize import (
    INT4_GROUP_SIZE,
    Int4Embedding,
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    cpu_kernel_dtype,
    dequantize_int4,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
    quantize_model,
)

__all__ = [
    "INT4_GROUP_SIZE",
    "Int4Embedding",
    "Int4Linear",
    "Int8Embedding",
    "Int8Linear",
    "cpu_kernel_dtype",
    "dequantize_int4",
    "quantize_int4_groupwise",
    "quantize_int8_per_channel",
    "quantize_model",
]
