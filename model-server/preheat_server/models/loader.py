"""Loads a model for serving: a built-in name, a GGUF file or a Hugging Face folder → weights on a device, quantized.

Uses only `safetensors` and `tokenizers` (no transformers). The wall time of the whole load is the
cold start the server exports.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .builtin import BUILTIN_SPECS, ensure_builtin
from .config import ModelConfig
from .cpu_gemm import prepack_linears
from .gguf_file import BUILTIN_GGUF_MODELS, ensure_gguf_folder, gguf_source
from .kernels import KernelReport
from .kernels import report as kernel_report
from .llama import LlamaForCausalLM
from .tokenizer import Tokenizer

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4")
_FLOAT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    config: ModelConfig
    name: str
    device: torch.device
    dtype: torch.dtype  # activation (and KV cache) dtype
    precision: str
    weight_bytes: int
    load_seconds: float
    path: Path
    kernels: KernelReport | None = None  # which kernel runs each linear (the start-up line and info metric)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch sees no CUDA device")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def resolve_precision(precision: str | None, device: torch.device) -> tuple[str, torch.dtype]:
    """(precision, activation dtype). Defaults: fp32 on CPU, bf16 on CUDA."""
    if precision is None or precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if device.type == "cpu" and precision == "fp16":
        raise ValueError("fp16 is for CUDA; on CPU use fp32 or bf16 (or int8/int4 weights)")
    if precision in _FLOAT:
        return precision, _FLOAT[precision]
    # Weight-only quantization: activations stay fp32 on CPU (aten's packed kernels take fp32), bf16 on GPU.
    return precision, torch.bfloat16 if device.type == "cuda" else torch.float32


def model_folder(name_or_path: str) -> tuple[str, Path]:
    if name_or_path in BUILTIN_SPECS:
        return name_or_path, ensure_builtin(name_or_path)
    gguf_path = gguf_source(name_or_path)
    if gguf_path is not None:  # converted once into a cached folder (see gguf_file)
        name = name_or_path if name_or_path in BUILTIN_GGUF_MODELS else gguf_path.stem
        return name, ensure_gguf_folder(gguf_path)
    p = Path(name_or_path).expanduser()
    if not (p / "config.json").is_file():
        raise ValueError(
            f"model {name_or_path!r} is neither a built-in ({', '.join((*BUILTIN_SPECS, *BUILTIN_GGUF_MODELS))}), "
            "a .gguf file nor a folder with config.json"
        )
    return p.name, p


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise ValueError(f"{folder} has no model.safetensors (or shards with an index)")
    return found


def load_weights(model: LlamaForCausalLM, folder: Path, dtype: torch.dtype, device: torch.device) -> None:
    """Read every tensor with safetensors and assign it (model was built on the meta device)."""
    expected = dict(model.state_dict(keep_vars=True))
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for key in sf.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                if key not in expected:
                    continue  # e.g. rotary_emb.inv_freq in old checkpoints
                t = sf.get_tensor(key)
                want = tuple(expected[key].shape)
                if tuple(t.shape) != want:
                    raise ValueError(f"weight {key} has shape {tuple(t.shape)}, config implies {want}")
                state[key] = t.to(device=device, dtype=dtype)
    tied = model.config.tie_word_embeddings
    if tied or "lm_head.weight" not in state:
        # Some checkpoints tie without saying so: no lm_head tensor means tied.
        state.pop("lm_head.weight", None)
        model.config.tie_word_embeddings = True
    missing = [k for k in expected if k not in state and k != "lm_head.weight"]
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks {len(missing)} weights, e.g. {missing[:3]}")
    model.load_state_dict(state, strict=False, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


def _plain_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers of the modules quantization leaves alone (norms, biases of plain layers)."""
    from ..quant.quantize import Int4Embedding, Int4Linear, Int8Embedding, Int8Linear

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Int4Embedding | Int4Linear | Int8Embedding | Int8Linear):
            continue
        for key, t in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]:
            out[f"{name}.{key}" if name else key] = t
    return out


def _load_quantized(config: ModelConfig, folder: Path, precision: str, load_dtype: torch.dtype,
                    dev: torch.device, fuse: bool) -> LlamaForCausalLM:
    """int8/int4 weights from the on-disk cache (see quant.cache), or quantized now and cached."""
    from ..quant import INT4_GROUP_SIZE, quantize_model
    from ..quant import cache as qcache

    # A checkpoint converted from block-quantized GGUF says its block size: int4 groups follow it.
    group = int(config.extra.get("quantization_block_size") or INT4_GROUP_SIZE)
    path = qcache.cache_file(weight_files(folder), precision, group, fuse)
    stored = qcache.load(path)
    if stored is not None:
        stored = {k: v.to(dev) for k, v in stored.items()}
        config.tie_word_embeddings = bool(stored.pop("meta.tied").item())
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        if fuse:
            model.fuse_projections()
        act = torch.bfloat16 if dev.type == "cuda" else torch.float32
        quantize_model(model, precision, group, store=stored, restore=True, act_dtype=act)
        plain = _plain_tensors(model)
        model.load_state_dict({k: stored[k] for k in plain}, strict=False, assign=True)
        left = [k for k, t in model.state_dict().items() if t.is_meta]
        if left:
            raise ValueError(f"the quantized cache {path} lacks {left[:3]}; delete it to recompute")
        return model
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    load_weights(model, folder, load_dtype, dev)
    if fuse:
        model.fuse_projections()
    store: dict[str, torch.Tensor] = {}
    quantize_model(model, precision, group, store=store)
    store.update(_plain_tensors(model))
    store["meta.tied"] = torch.tensor([int(model.config.tie_word_embeddings)])
    qcache.save(path, store)
    return model


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of every persistent tensor, shared (tied) storage counted once."""
    seen: set[int] = set()
    total = 0
    for t in module.state_dict().values():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        total += t.untyped_storage().nbytes()
    return total


def load_model(name_or_path: str, device: str = "auto", precision: str | None = None,
               fuse: bool = True, prepack: bool | None = None) -> LoadedModel:
    """Load ``tiny``/``small`` (generated and cached on first use) or a Hugging Face folder.

    ``fuse``: concatenate q/k/v and gate/up into one projection each after loading (fewer, larger
    GEMMs; the checkpoint keeps Hugging Face's names). Done before int8/int4 quantization, which is per
    output row, so the quantized weights are the same either way.
    ``prepack``: on CPU, run fp32/bf16 linears through oneDNN on weights reordered once (see
    ``cpu_gemm``); default on for float precisions on CPU. Packed layers have no ``.weight``.
    """
    t0 = time.perf_counter()
    dev = resolve_device(device)
    precision, dtype = resolve_precision(precision, dev)
    name, folder = model_folder(name_or_path)
    config = ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))
    # Quantizers start from fp32 on CPU (better scales); on CUDA from bf16 to save memory.
    load_dtype = dtype if precision in _FLOAT else (torch.float32 if dev.type == "cpu" else torch.bfloat16)
    if precision in ("int8", "int4"):
        model = _load_quantized(config, folder, precision, load_dtype, dev, fuse)
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        load_weights(model, folder, load_dtype, dev)
        if fuse:
            model.fuse_projections()
    model.eval()
    nbytes = weight_bytes(model)  # before packing: oneDNN's reordered copies are opaque to state_dict
    if prepack is None:
        prepack = dev.type == "cpu" and precision in _FLOAT
    if prepack:
        # A tied lm_head shares the embedding's table, which must stay a plain tensor.
        skip = (model.lm_head,) if config.tie_word_embeddings else ()
        prepack_linears(model, skip=skip)
    model.rope_tables(dev, dtype)
    tokenizer = Tokenizer.from_folder(folder, config.eos_token_id, config.eos_token_ids)
    if config.eos_token_id is None:
        config.eos_token_id = tokenizer.eos_token_id
    config.eos_token_ids = tuple(sorted({*config.eos_token_ids, *tokenizer.stop_token_ids}))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        name=name,
        device=dev,
        dtype=dtype,
        precision=precision,
        weight_bytes=nbytes,
        load_seconds=time.perf_counter() - t0,
        path=folder,
        kernels=kernel_report(model, dev.type, precision),
    )
