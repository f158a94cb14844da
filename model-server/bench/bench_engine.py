"""Engine benchmark (not a test): continuous batching vs transformers' generate, KV cache vs recompute, bytes.

    .venv/bin/python model-server/bench/bench_engine.py --out bench-results/engine.json

One run, one machine, one model (``small`` by default), side by side:
  * output tokens/s and TTFT p50/p99 at concurrency 1, 8, 32: this engine (all requests submitted at
    once, continuous batching) vs transformers ``generate`` one request at a time (FIFO: a request's
    TTFT includes waiting for the ones before it) and in one static padded batch;
  * decode tokens/s with the paged KV cache vs full recompute at 512 tokens of context;
  * weight bytes for fp32, bf16, int8, int4.
On CPU the engine's linears run through oneDNN on weights prepacked at load (the server's default);
each round also runs the engine with aten's plain ``F.linear`` (``engine_plain_linears``, the same
model) so the JSON shows what prepacking adds next to what batching adds (``--no-plain-linears`` skips it).
Requests have mixed prompt lengths and mixed ``max_tokens`` (seeded), greedy, EOS ignored.

On a shared machine the load drifts within minutes, so each concurrency level runs the three systems
interleaved, ``--rounds`` times (engine, one-at-a-time, static; engine, one-at-a-time, static; ...).
Every round is reported with the load average at its start; a level's ratios are the **median of the
per-round ratios** (each round's three systems ran back to back, under nearly the same load), and its
per-system figures are that system's median-throughput round.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from preheat_server.engine import EngineConfig, LLMEngine, SamplingParams
from preheat_server.hardware import machine_record
from preheat_server.models import load_model
from preheat_server.models.cpu_gemm import PackedLinear


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def workload(n: int, seed: int, vocab: int, prompt_range: tuple[int, int], out_range: tuple[int, int]):
    """``uniform``: prompt and output lengths drawn uniformly from the two ranges."""
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_range))], rng.randint(*out_range))
            for _ in range(n)]


# Production traces whose request lengths the trace workloads draw from: the full trace where ../shared
# is beside the repo, else the attributed excerpt committed for the tests (tests/sim/data/README.md).
REPO = Path(__file__).resolve().parents[2]
TRACES = {
    # Azure LLM inference trace 2023, code (CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024).
    "azure-code": (REPO.parent / "shared/traces/azure_llm_2023_code.csv",
                   REPO / "tests/sim/data/azure_llm_2023_code_excerpt.csv"),
    # Mooncake conversation trace (Apache-2.0; kvcache-ai/Mooncake, FAST '25).
    "mooncake": (REPO.parent / "shared/traces/mooncake_conversation.jsonl",
                 REPO / "tests/sim/data/mooncake_conversation_excerpt.jsonl"),
}
# How each trace's lengths are scaled for a 2-core CPU and a 2,048-token model (see trace_workload).
TRACE_SCALES = {"azure-code": (1 / 16, 1.0), "mooncake": (1 / 64, 1 / 4)}


def trace_lengths(path: Path) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of every request of an Azure LLM CSV or a Mooncake JSONL trace."""
    if path.suffix == ".jsonl":
        with path.open() as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [(int(r["input_length"]), int(r["output_length"])) for r in rows]
    with path.open(newline="") as f:
        return [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]


def trace_workload(n: int, seed: int, vocab: int, lengths: list[tuple[int, int]], prompt_scale: float,
                   output_scale: float, context: int, max_output: int):
    """n whole requests drawn (seeded) from a production trace, lengths scaled by a constant factor.

    A constant factor keeps each distribution's shape: the spread of output lengths is what a static
    batch pays for (it decodes until its longest request is done) and the spread of prompt lengths is
    its padding. The factors keep one CPU round to seconds (Mooncake's 7k-token median prompts would
    take minutes) and keep prefill's share of the time near what it is on a GPU, where a prompt's
    prefill costs about as much as a few decode steps; outputs are clipped to ``max_output`` and
    prompts so that prompt + output fits the model's context."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        prompt_tokens, output_tokens = lengths[rng.randrange(len(lengths))]
        out = max(1, min(round(output_tokens * output_scale), max_output))
        plen = max(4, min(round(prompt_tokens * prompt_scale), context - out - 1))
        reqs.append(([rng.randrange(3, vocab) for _ in range(plen)], out))
    return reqs


def summary(ttfts: list[float], tokens: int, wall: float) -> dict:
    return {"output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99)}


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def outputs_digest(outputs: list[list[int]]) -> str:
    """sha256 of the generated token ids, request by request (greedy: equal digests = equal outputs)."""
    return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]


def run_engine(loaded, reqs, max_num_seqs: int, max_num_batched_tokens: int) -> dict:
    # Room for every request's whole sequence (no preemption: the benchmark measures batching).
    blocks = max(max_num_seqs * 16, sum(-(-(len(p) + n) // 16) for p, n in reqs)) + 16
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                            num_kv_blocks=blocks))
    engine.generate([reqs[0][0][:4]], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    first: dict[str, float] = {}
    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reqs))}
    for i, (p, n) in enumerate(reqs):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
    tokens = steps = 0
    last: dict[str, float] = {}
    gaps: list[float] = []  # inter-token latency: time between a request's consecutive tokens
    while engine.has_unfinished_requests():
        steps += 1
        for o in engine.step():
            now = time.perf_counter()
            if o.new_token_ids and o.request_id not in first:
                first[o.request_id] = now - t0
            elif o.new_token_ids:
                gaps.append(now - last[o.request_id])
            if o.new_token_ids:
                last[o.request_id] = now
            tokens += len(o.new_token_ids)
            outs[o.request_id].extend(o.new_token_ids)
    wall = time.perf_counter() - t0
    out = summary(list(first.values()), tokens, wall)
    out["steps"] = steps
    out["itl_p50_s"], out["itl_p99_s"], out["itl_max_s"] = pct(gaps, 50), pct(gaps, 99), max(gaps, default=0.0)
    out["outputs_sha256"] = outputs_digest([outs[f"r{i}"] for i in range(len(reqs))])
    return out


class _FirstTokenTimer:
    """A transformers streamer that records when the first generated token arrives."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self):
        pass


def hf_generate(hf, ids: torch.Tensor, mask: torch.Tensor, n: int, streamer=None) -> torch.Tensor:
    # Inputs go where the model is (on CUDA, CPU tensors would be copied per call and warned about).
    return hf.generate(input_ids=ids.to(hf.device), attention_mask=mask.to(hf.device), max_new_tokens=n,
                       min_new_tokens=n, do_sample=False, pad_token_id=0, streamer=streamer)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so a clock read after it measures the work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_hf_serial(hf, reqs) -> dict:
    hf_generate(hf, torch.tensor([reqs[0][0][:4]]), torch.ones(1, 4, dtype=torch.long), 2)  # warm-up
    t0 = time.perf_counter()
    ttfts, tokens, outs = [], 0, []
    for p, n in reqs:
        timer = _FirstTokenTimer()
        out = hf_generate(hf, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long), n, timer)
        ttfts.append(timer.first - t0)
        tokens += out.shape[1] - len(p)
        outs.append(out[0, len(p):].tolist())
    res = summary(ttfts, tokens, time.perf_counter() - t0)
    res["outputs_sha256"] = outputs_digest(outs)
    return res


def run_hf_static(hf, reqs) -> dict:
    """One padded batch (left padding), run until its longest request is done."""
    width = max(len(p) for p, _ in reqs)
    ids = torch.zeros(len(reqs), width, dtype=torch.long)
    mask = torch.zeros(len(reqs), width, dtype=torch.long)
    for i, (p, _) in enumerate(reqs):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    n = max(m for _, m in reqs)
    hf_generate(hf, ids[:2, -4:], mask[:2, -4:], 2)  # warm-up, like the other two systems
    t0 = time.perf_counter()
    timer = _FirstTokenTimer()
    hf_generate(hf, ids, mask, n, timer)
    sync(hf.device)
    wall = time.perf_counter() - t0
    useful = sum(m for _, m in reqs)  # tokens each request asked for; the rest is padding work
    return summary([timer.first - t0] * len(reqs), useful, wall)


def kv_vs_recompute(loaded, context: int, decode_tokens: int) -> dict:
    prompt = [3 + (i * 7919) % (loaded.config.vocab_size - 3) for i in range(context)]
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=1, num_kv_blocks=context // 16 + 8))
    engine.add_request("kv", prompt, SamplingParams(max_tokens=decode_tokens + 1, ignore_eos=True))
    engine.step()  # prefill (not timed) and first token
    t0 = time.perf_counter()
    n = 0
    while engine.has_unfinished_requests():
        n += sum(len(o.new_token_ids) for o in engine.step())
    kv_tps = n / (time.perf_counter() - t0)
    ids = torch.tensor([prompt], device=loaded.device)
    loaded.model.forward_dense(ids[:, :16])
    reps = 3
    sync(loaded.device)
    t0 = time.perf_counter()
    for _ in range(reps):  # each new token recomputes the whole context
        loaded.model.forward_dense(ids)
    sync(loaded.device)
    rec_tps = reps / (time.perf_counter() - t0)
    return {"context_tokens": context, "kv_cache_tokens_per_s": kv_tps, "recompute_tokens_per_s": rec_tps,
            "speedup": kv_tps / rec_tps}


SYSTEMS = ("engine", "hf_one_at_a_time", "hf_static_batch")


def run_level(loaded, hf, reqs, c: int, rounds: int, max_num_batched_tokens: int, plain=None) -> dict:
    """The three systems interleaved ``rounds`` times; medians over rounds (see the module docstring).

    ``plain``: the same model with aten's F.linear instead of prepacked oneDNN linears; when given, the
    engine also runs on it in every round (``engine_plain_linears``), to show what prepacking adds."""
    row: dict = {"requests": c, "rounds": []}
    systems = SYSTEMS + (("engine_plain_linears",) if plain is not None else ())
    for r in range(rounds):
        rd: dict = {"round": r + 1, "loadavg_start": loadavg(),
                    "start_utc": datetime.now(UTC).isoformat(timespec="seconds")}
        with torch.inference_mode():
            rd["engine"] = run_engine(loaded, reqs, max(c, 1), max_num_batched_tokens)
            rd["hf_one_at_a_time"] = run_hf_serial(hf, reqs)
            rd["hf_static_batch"] = run_hf_static(hf, reqs)
            if plain is not None:
                rd["engine_plain_linears"] = run_engine(plain, reqs, max(c, 1), max_num_batched_tokens)
                rd["speedup_prepacked_vs_plain_linears"] = (rd["engine"]["tokens_per_s"]
                                                            / rd["engine_plain_linears"]["tokens_per_s"])
        rd["speedup_vs_one_at_a_time"] = rd["engine"]["tokens_per_s"] / rd["hf_one_at_a_time"]["tokens_per_s"]
        rd["speedup_vs_static_batch"] = rd["engine"]["tokens_per_s"] / rd["hf_static_batch"]["tokens_per_s"]
        row["rounds"].append(rd)
        print(f"c={c} round {r + 1}/{rounds} (load {rd['loadavg_start']}): engine "
              f"{rd['engine']['tokens_per_s']:.1f} tok/s, one-at-a-time {rd['hf_one_at_a_time']['tokens_per_s']:.1f}, "
              f"static {rd['hf_static_batch']['tokens_per_s']:.1f} -> {rd['speedup_vs_one_at_a_time']:.2f}x, "
              f"{rd['speedup_vs_static_batch']:.2f}x", flush=True)
    for name in systems:  # the system's median-throughput round (upper median for an even count)
        ranked = sorted(row["rounds"], key=lambda rd, name=name: rd[name]["tokens_per_s"])
        row[name] = ranked[len(ranked) // 2][name]
    keys = ("speedup_vs_one_at_a_time", "speedup_vs_static_batch")
    for key in keys + (("speedup_prepacked_vs_plain_linears",) if plain is not None else ()):
        vals = [rd[key] for rd in row["rounds"]]
        row[key] = statistics.median(vals)
        row[key.replace("speedup", "min_speedup")] = min(vals)
        row[key.replace("speedup", "max_speedup")] = max(vals)
    row["ratio_aggregate"] = "median over rounds of the per-round ratio"
    digests = {rd["engine"]["outputs_sha256"] for rd in row["rounds"]}
    row["engine_outputs_identical_across_rounds"] = len(digests) == 1
    return row


def make_requests(args, name: str, c: int, vocab: int, context: int):
    if name == "uniform":
        return workload(c, seed=100 + c, vocab=vocab, prompt_range=tuple(args.prompt_tokens),
                        out_range=tuple(args.output_tokens))
    prompt_scale, output_scale = TRACE_SCALES[name]
    return trace_workload(c, seed=100 + c, vocab=vocab, lengths=args.trace_lengths[name], prompt_scale=prompt_scale,
                          output_scale=output_scale, context=context, max_output=args.max_output_tokens)


def workload_description(args, name: str) -> dict:
    if name == "uniform":
        return {"kind": "uniform", "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                "seed": "100 + concurrency", "greedy": True, "ignore_eos": True}
    prompt_scale, output_scale = TRACE_SCALES[name]
    return {"kind": name, "trace": str(args.trace_paths[name]), "trace_requests": len(args.trace_lengths[name]),
            "prompt_scale": prompt_scale, "output_scale": output_scale, "max_output_tokens": args.max_output_tokens,
            "seed": "100 + concurrency", "greedy": True, "ignore_eos": True}


def level_targets(rows: dict, top: str) -> tuple[dict, dict]:
    top_rounds = rows[top]["rounds"]
    meeting = {
        f"c{top}_vs_one_at_a_time_ge_5x": sum(rd["speedup_vs_one_at_a_time"] >= 5.0 for rd in top_rounds),
        f"c{top}_vs_static_batch_ge_1.5x": sum(rd["speedup_vs_static_batch"] >= 1.5 for rd in top_rounds),
        "of": len(top_rounds),
    }
    targets = {
        f"c{top}_vs_one_at_a_time_ge_5x": rows[top]["speedup_vs_one_at_a_time"] >= 5.0,
        f"c{top}_vs_static_batch_ge_1.5x": rows[top]["speedup_vs_static_batch"] >= 1.5,
    }
    return meeting, targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default=None, help="default: fp32 on CPU, bf16 on CUDA")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--workload", nargs="+", choices=("uniform", *TRACES), default=["uniform", *TRACES],
                    help="request length mixes, each run at every concurrency level (default: all)")
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[8, 96], help="uniform: prompt length range")
    ap.add_argument("--output-tokens", type=int, nargs=2, default=[8, 64], help="uniform: output length range")
    ap.add_argument("--max-output-tokens", type=int, default=512, help="trace workloads: output length clip")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per concurrency level (>= 1)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=EngineConfig.max_num_batched_tokens,
                    help="engine token budget per step (default: the engine's and the server's default)")
    ap.add_argument("--no-plain-linears", action="store_true",
                    help="CPU: skip the engine run on aten F.linear beside the oneDNN-prepacked default")
    ap.add_argument("--out", type=Path, default=Path("bench-results/engine.json"))
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    args.trace_paths, args.trace_lengths = {}, {}
    for name in args.workload:
        if name in TRACES:
            path = next((p for p in TRACES[name] if p.exists()), None)
            if path is None:
                ap.error(f"{name} workload: no trace at {' or '.join(map(str, TRACES[name]))}")
            args.trace_paths[name], args.trace_lengths[name] = path, trace_lengths(path)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_start, utc_start = loadavg(), datetime.now(UTC).isoformat(timespec="seconds")
    loaded = load_model(args.model, device=args.device, precision=args.precision)
    import transformers

    packed = sum(isinstance(m, PackedLinear) for m in loaded.model.modules())
    plain = None
    if packed and not args.no_plain_linears:
        plain = load_model(args.model, device=args.device, precision=args.precision, prepack=False)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(loaded.path), dtype=loaded.dtype).to(loaded.device)
    hf.eval()
    result: dict = {
        "model": loaded.name, "device": str(loaded.device), "precision": loaded.precision,
        "threads": args.threads, "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": machine_record(), "cpu_count": torch.get_num_threads(),
        "kernels": loaded.kernels.line() if loaded.kernels else None,
        "load_seconds": loaded.load_seconds, "workloads": {},
        "engine_linears": (f"oneDNN, weights prepacked at load ({packed} layers)" if packed
                           else "aten F.linear"),
        "os_cpu_count": os.cpu_count(), "rounds": args.rounds, "max_num_batched_tokens": args.max_num_batched_tokens,
        "start_utc": utc_start, "loadavg_start": load_start,
    }
    if loaded.device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(loaded.device)
    top = str(max(args.concurrency))
    targets: dict = {}
    for name in args.workload:
        wl: dict = {"workload": workload_description(args, name), "concurrency": {}}
        for c in args.concurrency:
            reqs = make_requests(args, name, c, loaded.config.vocab_size, loaded.config.max_position_embeddings)
            row = run_level(loaded, hf, reqs, c, args.rounds, args.max_num_batched_tokens, plain)
            row["prompt_tokens"] = sum(len(p) for p, _ in reqs)
            row["output_tokens_requested"] = sum(n for _, n in reqs)
            row["longest_prompt"], row["longest_output"] = max(len(p) for p, _ in reqs), max(n for _, n in reqs)
            wl["concurrency"][str(c)] = row
            print(f"{name} c={c}: median ratios {row['speedup_vs_one_at_a_time']:.2f}x one-at-a-time, "
                  f"{row['speedup_vs_static_batch']:.2f}x static", flush=True)
        wl["rounds_meeting_targets"], wl["targets"] = level_targets(wl["concurrency"], top)
        targets.update({f"{name}_{k}": v for k, v in wl["targets"].items()})
        result["workloads"][name] = wl
    with torch.inference_mode():
        result["kv_cache_vs_recompute"] = kv_vs_recompute(loaded, args.context, decode_tokens=16)
    print("kv vs recompute:", result["kv_cache_vs_recompute"], flush=True)
    del hf, plain
    sizes = {}
    for p in ("fp32", "bf16", "int8", "int4"):
        dev = "cpu" if loaded.device.type == "cpu" else str(loaded.device)
        if p == "fp32" and loaded.precision == "fp32":
            sizes[p] = loaded.weight_bytes
            continue
        sizes[p] = load_model(args.model, device=dev, precision=p).weight_bytes
    result["weight_bytes"] = sizes
    result["weight_bytes_ratio_to_bf16"] = {p: b / sizes["bf16"] for p, b in sizes.items()}
    result["targets"] = {
        **targets,
        "kv_cache_vs_recompute_ge_5x": result["kv_cache_vs_recompute"]["speedup"] >= 5.0,
        "int8_le_0.55_of_bf16": result["weight_bytes_ratio_to_bf16"]["int8"] <= 0.55,
        "int4_le_0.30_of_bf16": result["weight_bytes_ratio_to_bf16"]["int4"] <= 0.30,
    }
    result["bench_seconds"] = time.perf_counter() - t_start
    result["loadavg_end"] = loadavg()
    result["end_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({"targets": result["targets"],
                      "rounds_meeting_targets": {n: w["rounds_meeting_targets"] for n, w in result["workloads"].items()},
                      "loadavg_start": load_start, "loadavg_end": result["loadavg_end"],
                      "weight_bytes": sizes}, indent=2))


if __name__ == "__main__":
    main()
