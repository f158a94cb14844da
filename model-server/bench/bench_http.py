"""HTTP-level benchmark of preheat-server (a benchmark, not a test: it measures, it does not assert).

Every server runs as its own `python -m preheat_server` process on 127.0.0.1, as in production, and
the load comes from an aiohttp client in this process. One run measures, side by side:

- embeddings/s at 32 concurrent clients with dynamic batching vs one at a time (max batch size 1), at fp32
  (the default) and bf16, with the cosine between the two precisions' vectors;
- the cold start (process start -> /health/ready 200, as the server exports it and as a client sees it)
  for the built-in `tiny` and `small` models;
- output tokens/s and TTFT p50/p99 at concurrency 1, 8 and 32 on `small` (streamed requests).

    .venv/bin/python model-server/bench/bench_http.py --out bench-results/http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from preheat_server.hardware import machine_record

REPO = Path(__file__).resolve().parents[2]
WORDS = [
    "the", "replica", "warm", "pool", "lead", "time", "cold", "start", "token", "request", "batch", "cache",
    "block", "prefix", "forecast", "policy", "scale", "kubernetes", "pod", "node", "latency", "throughput",
    "memory", "queue", "traffic", "decode", "prefill",
]


# ---- server processes ----

class ServerProcess:
    """A preheat-server process (or, with ``command``, another server that logs 'listening on URL')."""

    ready_path = "/health/ready"

    def __init__(self, args: list[str], log_dir: Path, name: str, command: list[str] | None = None) -> None:
        self.log_path = log_dir / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("POD_IP", None)
        self.started = time.time()
        self._log = self.log_path.open("w")
        command = command or [sys.executable, "-m", "preheat_server", *args, "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.url = ""

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float = 900) -> float:
        """Seconds from Popen to the first 200 from /health/ready (a client's view of the cold start)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            if not self.url:
                m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", self.log_path.read_text(errors="replace"))
                self.url = m.group(1) if m else ""
            if self.url:
                try:
                    async with session.get(self.url + self.ready_path) as r:
                        if r.status == 200:
                            return time.time() - self.started
                except aiohttp.ClientError:
                    pass
            await asyncio.sleep(0.05)
        raise TimeoutError("server not ready")

    async def metric(self, session: aiohttp.ClientSession, name: str) -> float:
        async with session.get(self.url + "/metrics") as r:
            text = await r.text()
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else float("nan")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


# ---- embeddings ----

async def _embedding_load(session: aiohttp.ClientSession, url: str, texts: list[str], clients: int,
                          keep: dict[str, list[float]] | None = None) -> float:
    """Closed loop: `clients` clients each send one text per request until `texts` is used up. Wall seconds."""
    queue = list(texts)

    async def client() -> None:
        while queue:
            text = queue.pop()
            async with session.post(url + "/v1/embeddings", json={"input": text}) as r:
                assert r.status == 200, await r.text()
                if keep is None:
                    await r.read()
                else:
                    keep[text] = (await r.json())["data"][0]["embedding"]

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0


async def bench_embeddings(session: aiohttp.ClientSession, log_dir: Path, clients: int, requests_total: int,
                           max_batch: int, delay_ms: float, precisions: list[str], rounds: int) -> dict[str, Any]:
    """Per precision, both servers (max batch `max_batch` and 1) stay up and take the same load in turns,
    `rounds` times in alternating order, so a noisy spell hits both; the ratio is the median of the
    per-round ratios."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) for _ in range(requests_total)]
    out: dict[str, Any] = {"clients": clients, "requests": requests_total, "rounds": rounds,
                           "max_queue_delay_ms": delay_ms}
    vectors: dict[str, dict[str, list[float]]] = {}
    modes = (("dynamic_batching", max_batch), ("one_at_a_time", 1))
    for precision in precisions:
        servers = {mode: ServerProcess(["--model", "all-MiniLM-L6-v2", "--precision", precision,
                                        "--embedding-max-batch-size", str(batch),
                                        "--embedding-max-queue-delay-ms", str(delay_ms), "--max-queue", "1024"],
                                       log_dir, f"embed-{precision}-{mode}")
                   for mode, batch in modes}
        try:
            for server in servers.values():
                await server.wait_ready(session)
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode, _ in modes}
            for r in range(rounds):
                order = modes if r % 2 == 0 else modes[::-1]
                for mode, _ in order:
                    server = servers[mode]
                    batches_before = await server.metric(session, "preheat:embedding_batch_size_count")
                    keep = vectors.setdefault(precision, {}) if (mode == "dynamic_batching" and r == rounds - 1) \
                        else None
                    wall = await _embedding_load(session, server.url, texts, clients, keep)
                    batches = await server.metric(session, "preheat:embedding_batch_size_count") - batches_before
                    runs[mode].append({"embeddings_per_s": requests_total / wall, "wall_s": wall,
                                       "mean_batch_size": requests_total / batches if batches else float("nan")})
        finally:
            for server in servers.values():
                server.stop()
        ratios = [d["embeddings_per_s"] / o["embeddings_per_s"]
                  for d, o in zip(runs["dynamic_batching"], runs["one_at_a_time"], strict=True)]
        row: dict[str, Any] = {mode: {"max_batch_size": batch, "runs": runs[mode],
                                      "embeddings_per_s": _pct([x["embeddings_per_s"] for x in runs[mode]], 50)}
                               for mode, batch in modes}
        row.update(speedup_per_round=ratios, speedup=_pct(ratios, 50), rounds_at_least_3x=sum(x >= 3 for x in ratios))
        out[precision] = row
        print(f"embeddings {precision}: dynamic {row['dynamic_batching']['embeddings_per_s']:.1f}/s, one at a time "
              f"{row['one_at_a_time']['embeddings_per_s']:.1f}/s -> median {row['speedup']:.2f}x "
              f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})", file=sys.stderr)
    if "fp32" in vectors and len(vectors) > 1:
        for precision, vecs in vectors.items():
            if precision == "fp32":
                continue
            cos = [sum(a * b for a, b in zip(vecs[t], vectors["fp32"][t], strict=True)) for t in texts]
            out[f"{precision}_vs_fp32_cosine"] = {"min": min(cos), "mean": sum(cos) / len(cos)}
    return out


# ---- cold start ----

async def bench_cold_start(session: aiohttp.ClientSession, log_dir: Path, model: str, device: str,
                           repeats: int) -> dict[str, Any]:
    exported, client_seen = [], []
    for i in range(repeats):
        server = ServerProcess(["--model", model, "--device", device], log_dir, f"cold-{model}-{i}")
        try:
            client_seen.append(await server.wait_ready(session))
            exported.append(await server.metric(session, "preheat:model_load_seconds"))
        finally:
            server.stop()
    out = {"model": model, "device": device, "runs": repeats,
           "model_load_seconds": exported, "client_seen_ready_s": client_seen,
           "median_model_load_seconds": _pct(exported, 50)}
    print(f"cold start {model}: {out['median_model_load_seconds']:.2f} s (exported), client saw "
          f"{_pct(client_seen, 50):.2f} s", file=sys.stderr)
    return out


# ---- generation ----

async def _one_stream(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "e2e": time.perf_counter() - t0,
            "tokens": tokens}


async def bench_generation(session: aiohttp.ClientSession, log_dir: Path, model: str, device: str,
                           levels: list[int], requests_per_client: int, prompt_words: int,
                           max_tokens: int) -> dict[str, Any]:
    max_seqs = max(levels)
    server = ServerProcess(["--model", model, "--device", device, "--max-num-seqs", str(max_seqs),
                            "--max-num-batched-tokens", "2048", "--max-queue", "1024",
                            "--completion-cache-size", "0", "--no-prefix-caching"], log_dir, f"gen-{model}")
    results = []
    try:
        await server.wait_ready(session)
        rng = random.Random(1)
        for c in levels:
            # Distinct prompts (and no prefix caching) so every request pays its own prefill.
            prompts = [f"{i} " + " ".join(rng.choice(WORDS) for _ in range(prompt_words))
                       for i in range(c * requests_per_client)]
            queue = list(prompts)
            samples: list[dict[str, float]] = []

            async def client(queue: list[str] = queue, samples: list[dict[str, float]] = samples) -> None:
                while queue:
                    samples.append(await _one_stream(session, server.url, queue.pop(), max_tokens))

            t0 = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(c)))
            wall = time.perf_counter() - t0
            ttfts = [s["ttft"] for s in samples]
            tokens = sum(s["tokens"] for s in samples)
            row = {"concurrency": c, "requests": len(samples), "output_tokens": tokens, "wall_s": wall,
                   "output_tokens_per_s": tokens / wall, "ttft_p50_s": _pct(ttfts, 50),
                   "ttft_p99_s": _pct(ttfts, 99),
                   "e2e_p50_s": _pct([s["e2e"] for s in samples], 50)}
            results.append(row)
            print(f"{model} c={c}: {row['output_tokens_per_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_s'] * 1000:.0f} ms "
                  f"p99 {row['ttft_p99_s'] * 1000:.0f} ms", file=sys.stderr)
    finally:
        server.stop()
    return {"model": model, "device": device, "prompt_words": prompt_words, "max_tokens": max_tokens,
            "levels": results}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="bench-http-"))
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**machine_record(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        if "embeddings" in args.sections:
            result["embeddings"] = await bench_embeddings(session, log_dir, args.embedding_clients,
                                                          args.embedding_requests, 32, args.embedding_delay_ms,
                                                          args.embedding_precisions, args.embedding_rounds)
        if "cold_start" in args.sections:
            result["cold_start"] = [await bench_cold_start(session, log_dir, m, args.device, args.cold_start_runs)
                                    for m in ("tiny", "small")]
        if "generation" in args.sections:
            result["generation"] = await bench_generation(session, log_dir, args.model, args.device, args.levels,
                                                          args.requests_per_client, args.prompt_words,
                                                          args.max_tokens)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["logs"] = str(log_dir)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-results/http.json"))
    p.add_argument("--sections", nargs="+", default=["embeddings", "cold_start", "generation"],
                   choices=["embeddings", "cold_start", "generation"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="small", help="model for the generation section")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--prompt-words", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--embedding-clients", type=int, default=32)
    p.add_argument("--embedding-requests", type=int, default=512)
    p.add_argument("--embedding-delay-ms", type=float, default=5.0)
    p.add_argument("--embedding-precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"],
                   help="fp32 is the server's default; bf16 is shown beside it with its cosine to fp32")
    p.add_argument("--embedding-rounds", type=int, default=3)
    p.add_argument("--cold-start-runs", type=int, default=1)
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
