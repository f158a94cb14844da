"""`preheat plan`: how much memory does a model need, how many replicas, and what does a token cost?

Weight memory = parameters x bytes per element (+ small overhead for int8/int4 scales). KV cache per
token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element (Llama-2-7B fp16: 0.5 MiB).
Replicas = ceil(rate / (per-replica throughput x target utilization)), at least enough for the
concurrency. Cost per million tokens = hourly price x replicas / tokens per hour.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# bytes per element; quantized weights also carry one fp16 scale per group of 128 (gpt-fast style).
BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
GROUP_SCALE_BYTES = {"int8": 2.0 / 128, "int4": 2.0 / 128}
# The KV cache stays in 16-bit for int8/int4 weight-only quantization (what gpt-fast and vLLM do by default).
KV_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 2.0, "int4": 2.0}
GB = 1e9
MIB = 2**20


class PlanError(ValueError):
    pass


@dataclass
class ModelShape:
    params: float
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden: int | None = None
    source: str = "flags"


@dataclass
class Plan:
    model: dict[str, Any]
    precision: str
    weight_bytes: float
    weight_gb: float
    weights_by_precision_gb: dict[str, float]
    kv_bytes_per_token: float | None
    kv_mib_per_token: float | None
    kv_bytes_per_sequence: float | None
    kv_gb_for_concurrency: float | None
    memory_per_replica_gb: float | None
    context: int
    concurrency: int
    rate_rps: float | None
    tokens_per_request: float
    latency_ms: float | None
    replicas_gpu: int | None
    replicas_cpu: int | None
    cost: dict[str, float | None]
    notes: list[str]


def shape_from_config(path: str | Path) -> ModelShape:
    """Read a Hugging Face config.json (Llama/Mistral/Qwen/GPT-style field names)."""
    try:
        cfg = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanError(f"--config: no such file {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise PlanError(f"--config {path}: not a JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise PlanError(f"--config {path}: expected a JSON object")

    def get(*names: str) -> Any:
        for n in names:
            if n in cfg and cfg[n] is not None:
                return cfg[n]
        return None

    hidden = get("hidden_size", "n_embd", "d_model")
    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head")
    kv_heads = get("num_key_value_heads", "multi_query_group_num") or heads
    head_dim = get("head_dim") or (hidden // heads if hidden and heads else None)
    inter = get("intermediate_size", "n_inner") or (4 * hidden if hidden else None)
    vocab = get("vocab_size")
    if not (hidden and layers and heads):
        raise PlanError(f"--config {path}: needs hidden_size, num_hidden_layers and num_attention_heads")
    # Parameter estimate: attention (q, o full; k, v by kv heads) + gated MLP (3 matrices when the
    # config says so, Llama-style) + embeddings (tied or not).
    attn = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2
    gated = cfg.get("hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh") or "llama" in str(cfg.get("model_type", ""))
    mlp = (3 if gated else 2) * hidden * inter
    emb = (vocab or 0) * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    params = layers * (attn + mlp + 2 * hidden) + emb
    return ModelShape(float(params), int(layers), int(kv_heads), int(head_dim), int(hidden), f"config {Path(path).name}")


def plan(args: argparse.Namespace) -> Plan:
    if args.config:
        shape = shape_from_config(args.config)
        if args.params:
            shape.params = args.params
    else:
        if args.params is None and not (args.layers and args.hidden):
            raise PlanError("give --params N, --config config.json, or --layers/--hidden (and --kv-heads/--head-dim)")
        params = args.params
        if params is None:
            # Llama-style estimate from the shape: 12 x layers x hidden^2 (attention 4h^2 + MLP 8h^2).
            params = 12.0 * args.layers * args.hidden**2
        head_dim = args.head_dim or (args.hidden // args.heads if args.hidden and args.heads else None)
        shape = ModelShape(float(params), args.layers, args.kv_heads or args.heads, head_dim, args.hidden)
    if not (shape.params > 0 and math.isfinite(shape.params)):
        raise PlanError(f"--params must be a positive number, got {shape.params!r}")
    for name in ("context", "concurrency"):
        if getattr(args, name) < 1:
            raise PlanError(f"--{name} must be at least 1")
    prec = args.precision
    notes: list[str] = []

    def weights(p: str) -> float:
        return shape.params * (BYTES[p] + GROUP_SCALE_BYTES.get(p, 0.0))

    wb = weights(prec)
    kv_tok = None
    if shape.layers and shape.kv_heads and shape.head_dim:
        kv_tok = 2.0 * shape.layers * shape.kv_heads * shape.head_dim * KV_BYTES[prec]
    else:
        notes.append("KV cache needs --layers, --kv-heads and --head-dim (or --config)")
    kv_seq = kv_tok * args.context if kv_tok is not None else None
    kv_conc = kv_seq * args.concurrency if kv_seq is not None else None
    mem = (wb + (kv_conc or 0.0)) * 1.1 / GB  # 10 % for activations, CUDA graphs, fragmentation
    tokens_per_request = args.input_tokens + args.output_tokens
    rate = args.rate
    util = args.target_utilization

    def replicas(per_replica_rps: float | None) -> int | None:
        if rate is None or per_replica_rps is None:
            return None
        by_rate = math.ceil(rate / (per_replica_rps * util) - 1e-9)
        return max(1, by_rate)

    gpu_rps = args.gpu_tps / tokens_per_request if args.gpu_tps else None
    cpu_rps = args.cpu_tps / tokens_per_request if args.cpu_tps else None
    if args.latency_ms is not None:
        # A request's decode alone takes output_tokens / per-sequence speed; say when that breaks the budget.
        for label, tps in (("GPU", args.gpu_seq_tps), ("CPU", args.cpu_seq_tps)):
            if tps:
                need_ms = 1000.0 * args.output_tokens / tps
                if need_ms > args.latency_ms:
                    notes.append(f"{label}: {args.output_tokens} output tokens at {tps:g} tokens/s per sequence take "
                                 f"{need_ms:.0f} ms, over the {args.latency_ms:g} ms budget")
    r_gpu, r_cpu = replicas(gpu_rps), replicas(cpu_rps)

    def per_mtok(price_hour: float | None, tps: float | None) -> float | None:
        if not price_hour or not tps:
            return None
        return price_hour / (tps * util * 3600.0) * 1e6

    cost = {
        "gpu_usd_per_mtok": per_mtok(args.gpu_hour_usd, args.gpu_tps),
        "cpu_usd_per_mtok": per_mtok(args.cpu_hour_usd, args.cpu_tps),
        "managed_usd_per_mtok": args.managed_usd_per_mtok,
        "gpu_fleet_usd_per_hour": r_gpu * args.gpu_hour_usd if r_gpu and args.gpu_hour_usd else None,
        "cpu_fleet_usd_per_hour": r_cpu * args.cpu_hour_usd if r_cpu and args.cpu_hour_usd else None,
        "managed_usd_per_hour": (rate * tokens_per_request * 3600 / 1e6 * args.managed_usd_per_mtok)
        if rate and args.managed_usd_per_mtok else None,
    }
    if args.gpu_memory_gb and mem > args.gpu_memory_gb:
        notes.append(f"{mem:.1f} GB per replica exceeds --gpu-memory-gb {args.gpu_memory_gb:g}: "
                     "use a lower precision, shorter context, fewer concurrent sequences or tensor parallelism")
    return Plan(
        model=asdict(shape), precision=prec, weight_bytes=wb, weight_gb=wb / GB,
        weights_by_precision_gb={p: weights(p) / GB for p in BYTES},
        kv_bytes_per_token=kv_tok, kv_mib_per_token=None if kv_tok is None else kv_tok / MIB,
        kv_bytes_per_sequence=kv_seq, kv_gb_for_concurrency=None if kv_conc is None else kv_conc / GB,
        memory_per_replica_gb=mem, context=args.context, concurrency=args.concurrency, rate_rps=rate,
        tokens_per_request=tokens_per_request, latency_ms=args.latency_ms, replicas_gpu=r_gpu, replicas_cpu=r_cpu,
        cost=cost, notes=notes,
    )


def render(p: Plan) -> str:
    def f(x: float | None, fmt: str, unit: str = "") -> str:
        return "n/a" if x is None else format(x, fmt) + unit

    lines = [
        f"model: {p.model['params'] / 1e9:.2f} B parameters ({p.model['source']})",
        f"weights at {p.precision}: {p.weight_gb:.2f} GB   ("
        + ", ".join(f"{k} {v:.1f} GB" for k, v in p.weights_by_precision_gb.items()) + ")",
        f"KV cache: {f(p.kv_bytes_per_token, ',.0f', ' bytes')}/token ({f(p.kv_mib_per_token, '.4g', ' MiB')}), "
        f"{f(None if p.kv_bytes_per_sequence is None else p.kv_bytes_per_sequence / GB, '.3f', ' GB')} per "
        f"{p.context}-token sequence, {f(p.kv_gb_for_concurrency, '.2f', ' GB')} for {p.concurrency} concurrent",
        f"memory per replica (weights + KV + 10 %): {f(p.memory_per_replica_gb, '.2f', ' GB')}",
    ]
    if p.rate_rps is not None:
        lines.append(f"at {p.rate_rps:g} req/s x {p.tokens_per_request:g} tokens: GPU replicas {f(p.replicas_gpu, 'd')}, "
                     f"CPU replicas {f(p.replicas_cpu, 'd')}")
    c = p.cost
    lines.append(f"cost per million tokens: GPU {f(c['gpu_usd_per_mtok'], '.3f', ' USD')}, "
                 f"CPU {f(c['cpu_usd_per_mtok'], '.3f', ' USD')}, managed {f(c['managed_usd_per_mtok'], '.3f', ' USD')}")
    if any(c[k] is not None for k in ("gpu_fleet_usd_per_hour", "cpu_fleet_usd_per_hour", "managed_usd_per_hour")):
        lines.append(f"per hour at the rate: GPU fleet {f(c['gpu_fleet_usd_per_hour'], '.2f', ' USD')}, "
                     f"CPU fleet {f(c['cpu_fleet_usd_per_hour'], '.2f', ' USD')}, managed {f(c['managed_usd_per_hour'], '.2f', ' USD')}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="preheat plan", description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, help="parameter count, e.g. 7e9")
    p.add_argument("--config", help="Hugging Face config.json")
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int, help="attention heads (for head_dim = hidden / heads)")
    p.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention)")
    p.add_argument("--head-dim", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--precision", choices=sorted(BYTES), default="fp16")
    p.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent sequences per replica (default 16)")
    p.add_argument("--rate", type=float, help="target request rate (req/s)")
    p.add_argument("--input-tokens", type=float, default=512.0)
    p.add_argument("--output-tokens", type=float, default=256.0)
    p.add_argument("--latency-ms", type=float, help="end-to-end latency budget")
    p.add_argument("--target-utilization", type=float, default=0.7)
    p.add_argument("--gpu-tps", type=float, help="tokens/s one GPU replica sustains (all sequences)")
    p.add_argument("--cpu-tps", type=float, help="tokens/s one CPU replica sustains")
    p.add_argument("--gpu-seq-tps", type=float, help="decode tokens/s of one sequence on GPU")
    p.add_argument("--cpu-seq-tps", type=float, help="decode tokens/s of one sequence on CPU")
    p.add_argument("--gpu-hour-usd", type=float)
    p.add_argument("--cpu-hour-usd", type=float)
    p.add_argument("--managed-usd-per-mtok", type=float, help="a managed API's price per million tokens")
    p.add_argument("--gpu-memory-gb", type=float, help="warn when a replica does not fit")
    p.add_argument("--json", dest="json_out", help="write the plan as JSON here ('-' for stdout)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        for name in ("gpu_tps", "cpu_tps", "gpu_hour_usd", "cpu_hour_usd", "managed_usd_per_mtok", "rate", "latency_ms"):
            v = getattr(args, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise PlanError(f"--{name.replace('_', '-')} must be a positive number, got {v!r}")
        if not 0 < args.target_utilization <= 1:
            raise PlanError("--target-utilization must be in (0, 1]")
        result = plan(args)
    except PlanError as e:
        print(f"preheat plan: error: {e}", file=sys.stderr)
        return 2
    if args.json_out == "-":
        print(json.dumps(asdict(result), indent=2))
    else:
        print(render(result))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
