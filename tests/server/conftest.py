"""Fixtures for the model server's HTTP, embedding and lifecycle tests.

The tiny model and the embedding model are loaded once per session (real weights, real tokenizers);
each test gets its own real server (own engine, KV cache, metrics registry) on 127.0.0.1 and a port
the kernel picks. Servers run in-process on the test's event loop unless a test needs a separate
process (SIGTERM, schemathesis).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import torch
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def http_tiny_model() -> Any:
    """The built-in tiny Llama (generated from its seed on first use, then cached)."""
    from preheat_server.models import load_model

    torch.set_num_threads(2)
    return load_model("tiny", device="cpu")


@pytest.fixture(scope="session")
def http_embedding_model() -> Any:
    from preheat_server.embeddings import EmbeddingModel

    torch.set_num_threads(2)
    return EmbeddingModel.load("all-MiniLM-L6-v2")


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items without model_name): value}."""
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


@dataclass
class LiveServer:
    """A started in-process server plus a client session pointed at it."""

    server: Any
    url: str
    session: aiohttp.ClientSession

    async def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any, dict]:
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"}) as r:
            text = await r.text()
            try:
                payload = json.loads(text)
            except json.JSONDecodeError:
                payload = text
            return r.status, payload, dict(r.headers)

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.url + path) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except json.JSONDecodeError:
                return r.status, text

    async def metrics(self) -> dict[tuple[str, tuple], float]:
        status, text = await self.get("/metrics")
        assert status == 200
        return parse_metrics(text)

    async def metrics_when(self, predicate: Callable[[dict], bool], attempts: int = 3000) -> dict:
        """Poll /metrics until `predicate(metrics)` holds (the engine thread updates them
        asynchronously); return the last scrape either way, for the caller's assertions."""
        m = await self.metrics()
        for _ in range(attempts):
            if predicate(m):
                break
            await asyncio.sleep(0.01)
            m = await self.metrics()
        return m

    async def stream(self, path: str, body: dict) -> tuple[list[str], dict]:
        """POST with stream=true; return the raw `data:` payloads in order and the headers."""
        events: list[str] = []
        async with self.session.post(self.url + path, json={**body, "stream": True}) as r:
            assert r.status == 200, await r.text()
            buffer = b""
            async for chunk in r.content.iter_any():
                buffer += chunk
            for block in buffer.split(b"\n\n"):
                if block.strip():
                    line = block.decode()
                    assert line.startswith("data: "), f"not an SSE data line: {line!r}"
                    events.append(line[len("data: "):])
            return events, dict(r.headers)


@pytest_asyncio.fixture
async def start_http_server(http_tiny_model: Any) -> AsyncIterator[Callable[..., Any]]:
    """Factory: `await start_http_server(**ServerConfig fields)` -> LiveServer (ready)."""
    from preheat_server.config import ServerConfig
    from preheat_server.server import Server

    started: list[LiveServer] = []

    async def start(generation_loader: Callable | None = None, embedding_loader: Callable | None = None,
                    wait: bool = True, **fields: Any) -> LiveServer:
        fields.setdefault("max_num_seqs", 8)
        fields.setdefault("max_num_batched_tokens", 256)
        config = ServerConfig(host="127.0.0.1", port=0, **fields)
        kwargs: dict[str, Any] = {"generation_loader": generation_loader or (lambda _cfg: http_tiny_model)}
        if embedding_loader is not None:
            kwargs["embedding_loader"] = embedding_loader
        server = Server(config, **kwargs)
        await server.start()
        live = LiveServer(server, f"http://127.0.0.1:{server.port}",
                          aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)))
        started.append(live)
        if wait:
            await server.wait_ready()
        return live

    yield start
    for live in started:
        await live.session.close()
        await live.server.close()


# ---- a server in its own process (SIGTERM, schemathesis) ----

@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def spawn_server(args: list[str], log_path: Path, timeout_s: float = 180.0) -> ServerProcess:
    """`python -m preheat_server ARGS --port 0`; waits until it logs the port it bound."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"}
    env.pop("POD_IP", None)
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "preheat_server", *args, "--host", "127.0.0.1", "--port", "0"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text(errors="replace"))
        if m:
            return ServerProcess(proc, m.group(1), log_path)
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not bind within {timeout_s} s:\n{log_path.read_text()}")


def wait_ready(url: str, timeout_s: float = 180.0) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health/ready", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {timeout_s} s")


# ---- a model whose greedy output is scripted: multi-byte characters split across byte tokens ----

@pytest.fixture(scope="session")
def scripted_model(http_tiny_model: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, int, str]:
    """The tiny model's folder with its weights edited so that, greedily, a trigger token is followed
    by the single-byte tokens of "😀é" (F0 9F 98 80 C3 A9) and then end-of-sequence.

    How: attention and MLP outputs are zeroed, so the last hidden state depends only on the current
    token; the (untied) LM head row of each scripted next token points along the normalised hidden
    state of its predecessor, so that token wins the argmax. Returns (loaded model, trigger id, text).
    """
    import shutil

    from preheat_server.models import load_model
    from safetensors.torch import load_file, save_file

    src = Path(http_tiny_model.path)
    dst = tmp_path_factory.mktemp("scripted-model")
    for f in src.iterdir():
        if f.is_file() and f.suffix == ".json":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (dst / "config.json").write_text(json.dumps(config))

    weights = {k: v.float().clone() for k, v in load_file(str(src / "model.safetensors")).items()}
    for name in weights:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name].zero_()
    tok = http_tiny_model.tokenizer
    text = "😀é"
    byte_ids = []
    for b in text.encode():
        ids = [i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes([b])]
        assert ids, f"the tiny vocabulary has no single-byte token for {b:#x}"
        byte_ids.append(ids[0])
    eos = int(tok.eos_token_id)
    trigger = next(i for i in range(1, tok.vocab_size) if i not in (*byte_ids, eos) and tok.token_bytes(i))
    chain = [trigger, *byte_ids, eos]
    embed = weights["model.embed_tokens.weight"]
    norm_w = weights["model.norm.weight"]
    eps = float(config.get("rms_norm_eps", 1e-5))

    def final_hidden(t: int) -> torch.Tensor:
        e = embed[t]
        return e * torch.rsqrt(e.pow(2).mean() + eps) * norm_w

    lm_head = torch.zeros_like(embed)
    for prev, nxt in itertools.pairwise(chain):
        h = final_hidden(prev)
        lm_head[nxt] = 50.0 * h / h.norm()
    weights["lm_head.weight"] = lm_head
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    return load_model(str(dst), device="cpu", precision="fp32"), trigger, text


@pytest.fixture
def spawn_server_process(tmp_path: Path) -> Any:
    """Factory: `spawn_server_process(args)` -> ServerProcess (bound, maybe not ready); stopped at teardown."""
    procs: list[ServerProcess] = []

    def spawn(args: list[str], name: str = "server") -> ServerProcess:
        proc = spawn_server(args, tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield spawn
    for p in procs:
        p.stop()


@pytest.fixture
def server_tools() -> Any:
    """Helpers for tests against a server process: parse_metrics(text), wait_ready(url)."""
    import types

    return types.SimpleNamespace(parse_metrics=parse_metrics, wait_ready=wait_ready)
