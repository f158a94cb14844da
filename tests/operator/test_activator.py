"""`preheat activator` over real HTTP on 127.0.0.1: requests held while nothing listens upstream,
forwarded (streamed) once an upstream answers, and the limits (hold timeout, max held, body size)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from preheat.activator import make_app, parse_args
from preheat.cli import main as preheat_main
from prometheus_client.parser import text_string_to_metric_families

ENDPOINT = "demo"
Serve = Callable[[web.Application, int], Awaitable[str]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an aiohttp app on 127.0.0.1:port (0: any free port); every runner is cleaned up at the end."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, port: int = 0) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def activator(upstream_port: int, *, hold: float = 30.0, max_held: int = 10,
              max_body: int = 1 << 20) -> web.Application:
    return make_app(f"http://127.0.0.1:{upstream_port}", ENDPOINT, hold, max_held, max_body)


async def scrape(client: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The activator's /metrics: sample name -> value, for the `endpoint` label of these tests."""
    async with client.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.labels.get("endpoint") == ENDPOINT and "le" not in s.labels}


async def until_waiting(client: aiohttp.ClientSession, base: str, n: int) -> dict[str, float]:
    """Poll /metrics until the waiting gauge reads n (the request is held)."""
    async def poll() -> dict[str, float]:
        while (metrics := await scrape(client, base))["preheat:activator_requests_waiting"] != n:
            await asyncio.sleep(0.01)
        return metrics
    return await asyncio.wait_for(poll(), timeout=10)


async def fetch(client: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any, Any]:
    async with client.request(method, url, **kw) as resp:
        return resp.status, await resp.read(), resp.headers


async def test_held_until_upstream_starts_then_forwarded(serve: Serve, client: aiohttp.ClientSession) -> None:
    port = free_port()
    base = await serve(activator(port), 0)
    first = await scrape(client, base)
    assert first["preheat:activator_requests_waiting"] == 0  # exported from the first scrape
    assert first["preheat:activator_requests_total"] == 0
    seen: list[tuple[str, str, str, bytes]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, request.query_string, await request.read()))
        return web.json_response({"ok": True}, status=201, headers={"X-Upstream": "yes"})

    sent = asyncio.create_task(fetch(client, "POST", f"{base}/v1/completions?a=1&b=two",
                                     json={"prompt": "hi", "max_tokens": 3}))
    held = await until_waiting(client, base, 1)
    assert held["preheat:activator_requests_total"] == 1
    assert not sent.done()
    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", answer)
    await serve(upstream, port)
    status, body, headers = await asyncio.wait_for(sent, timeout=10)
    assert (status, json.loads(body), headers["X-Upstream"]) == (201, {"ok": True}, "yes")
    assert seen == [("POST", "/v1/completions", "a=1&b=two", b'{"prompt": "hi", "max_tokens": 3}')]
    after = await scrape(client, base)
    assert after["preheat:activator_requests_waiting"] == 0
    assert after["preheat:activator_hold_seconds_count"] == 1
    assert after["preheat:activator_timeouts_total"] == 0


async def test_streamed_chunks_arrive_one_by_one_in_order(serve: Serve,
                                                          client: aiohttp.ClientSession) -> None:
    chunks = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    received = [asyncio.Event() for _ in chunks]

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk, got in zip(chunks, received, strict=True):
            await resp.write(chunk)
            await asyncio.wait_for(got.wait(), timeout=10)  # the client has it before the next is sent
        await resp.write_eof()
        return resp

    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", stream)
    port = int((await serve(upstream, 0)).rsplit(":", 1)[1])
    base = await serve(activator(port), 0)
    got = []
    async with client.post(f"{base}/v1/chat/completions", json={"stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        for event in received:
            got.append(await asyncio.wait_for(resp.content.readany(), timeout=10))
            event.set()
        assert await resp.content.read() == b""
    assert got == chunks


async def test_hold_timeout_answers_504(serve: Serve, client: aiohttp.ClientSession) -> None:
    base = await serve(activator(free_port(), hold=0.3), 0)
    status, body, _ = await fetch(client, "POST", f"{base}/v1/completions", json={"prompt": "x"})
    assert status == 504
    error = json.loads(body)["error"]
    assert error["type"] == "activator_timeout"
    assert "no serving replica answered within 0.3 s" in error["message"]
    metrics = await scrape(client, base)
    assert metrics["preheat:activator_timeouts_total"] == 1
    assert metrics["preheat:activator_requests_waiting"] == 0
    assert metrics["preheat:activator_requests_total"] == 1
    assert metrics["preheat:activator_hold_seconds_count"] == 0


async def test_over_max_held_answers_503_at_once(serve: Serve, client: aiohttp.ClientSession) -> None:
    base = await serve(activator(free_port(), max_held=1), 0)
    held = asyncio.create_task(fetch(client, "GET", f"{base}/v1/models"))
    await until_waiting(client, base, 1)
    status, body, headers = await fetch(client, "POST", f"{base}/v1/completions", json={"prompt": "x"})
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert "1 requests" in json.loads(body)["error"]["message"]
    assert not held.done()
    held.cancel()
    metrics = await scrape(client, base)
    assert metrics["preheat:activator_requests_total"] == 2  # both count as demand


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_the_limit_answers_413(serve: Serve, client: aiohttp.ClientSession,
                                               chunked: bool) -> None:
    calls = []

    async def answer(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(text="should not be reached")

    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", answer)
    port = int((await serve(upstream, 0)).rsplit(":", 1)[1])
    base = await serve(activator(port, max_body=100), 0)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 40

    status, raw, _ = await fetch(client, "POST", f"{base}/v1/completions",
                                 data=body() if chunked else b"x" * 160)
    assert status == 413
    assert "over 100 bytes" in json.loads(raw)["error"]["message"]
    assert calls == []
    assert (await scrape(client, base))["preheat:activator_requests_waiting"] == 0


async def test_upstream_failing_mid_body_is_not_retried(serve: Serve, client: aiohttp.ClientSession) -> None:
    calls = []

    async def broken(request: web.Request) -> web.StreamResponse:
        calls.append(request.path)
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"partial")
        request.transport.abort()
        return resp

    upstream = web.Application()
    upstream.router.add_post("/v1/completions", broken)
    port = int((await serve(upstream, 0)).rsplit(":", 1)[1])
    base = await serve(activator(port), 0)
    with pytest.raises(aiohttp.ClientPayloadError):
        await fetch(client, "POST", f"{base}/v1/completions", json={"prompt": "x"})
    assert calls == ["/v1/completions"]


async def test_healthz(serve: Serve, client: aiohttp.ClientSession) -> None:
    base = await serve(activator(free_port()), 0)
    status, body, _ = await fetch(client, "GET", f"{base}/healthz")
    assert (status, body) == (200, b"ok")
    assert (await scrape(client, base))["preheat:activator_requests_total"] == 0


@pytest.mark.parametrize("upstream", ["ftp://x", "notaurl", "http://"])
def test_bad_upstream_is_a_usage_error(upstream: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        preheat_main(["activator", "--upstream", upstream, "--endpoint", ENDPOINT])
    assert exit_.value.code == 2
    assert "--upstream" in capsys.readouterr().err


def test_cli_defaults() -> None:
    args = parse_args(["--upstream", "http://demo-serving.ns.svc:8000", "--endpoint", ENDPOINT])
    got = (args.port, args.hold_timeout_seconds, args.max_held, args.max_body_bytes)
    assert got == (8012, 600.0, 1000, 1 << 26)
