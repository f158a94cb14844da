"""Load generator: schedules from real trace excerpts, and replays against real aiohttp servers.

The servers here are real HTTP servers on 127.0.0.1 that behave like a model server's
`/v1/completions` at the level the load generator cares about (a bounded number of slots, a bounded
queue answering 429, usage in the body); `test_loadgen_server.py` replays against the real
`preheat-server --model tiny`.
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import socket
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from preheat_lab.loadgen import (
    Arrival,
    ReplayConfig,
    Replayer,
    RequestRecord,
    StaticEndpoints,
    TokenShaping,
    check_loopback,
    from_rate_series,
    from_requests,
    offered_rate,
    percentile,
    summarize,
)
from preheat_lab.loadgen.endpoints import ready_addresses_from_pods, ready_addresses_from_slices

DATA = Path(__file__).parent / "data"


def azure_excerpt() -> tuple[list[float], list[float], list[float]]:
    t, c, g = [], [], []
    with open(DATA / "azure_code_2023_excerpt.csv") as f:
        for row in csv.DictReader(f):
            t.append(datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp())
            c.append(float(row["ContextTokens"]))
            g.append(float(row["GeneratedTokens"]))
    return t, c, g


def servegen_excerpt() -> tuple[list[float], list[float]]:
    with open(DATA / "servegen_m-small_day2_morning.csv") as f:
        rows = list(csv.DictReader(f))
    return [float(r["t_s"]) for r in rows], [float(r["total_rate_rps"]) for r in rows]


# --- schedules --------------------------------------------------------------------------------


def test_per_request_trace_is_compressed_and_keeps_order():
    t, c, g = azure_excerpt()
    arr = from_requests(t, c, g, compress=10.0)
    assert len(arr) == len(t)
    span = max(t) - min(t)
    assert arr[-1].t_s == pytest.approx(span / 10.0)
    assert all(a.t_s <= b.t_s for a, b in itertools.pairwise(arr))
    shaping = TokenShaping()
    assert all(shaping.prompt_min <= a.prompt_tokens <= shaping.prompt_max for a in arr)
    assert all(shaping.output_min <= a.max_tokens <= shaping.output_max for a in arr)


def test_rate_scale_repeats_whole_copies_and_thins_fractions():
    t, c, g = azure_excerpt()
    assert len(from_requests(t, c, g, compress=5, rate_scale=3.0)) == 3 * len(t)
    half = len(from_requests(t, c, g, compress=5, rate_scale=0.5, seed=1))
    # binomial(300, 0.5): 6 standard deviations either side
    assert 150 - 52 < half < 150 + 52


def test_slice_selects_a_window_of_trace_time():
    t, c, g = azure_excerpt()
    t0 = min(t) + 60
    arr = from_requests(t, c, g, compress=2.0, start_s=t0, duration_s=30)
    expected = sum(1 for x in t if t0 <= x < t0 + 30)
    assert len(arr) == expected
    assert all(0 <= a.t_s < 15 for a in arr)


def test_rate_series_follows_the_ramp():
    t, r = servegen_excerpt()
    compress, scale = 600.0, 0.01
    arr = from_rate_series(t, r, compress=compress, rate_scale=scale, seed=3)
    expected_total = sum(x * 600 for x in r) / compress * scale
    assert abs(len(arr) - expected_total) < 6 * np.sqrt(expected_total) + 0.02 * expected_total
    # The excerpt's ramp (hours 4–11 rise ~2.7×) must be visible in the offered rate.
    hour = 3600 / compress
    night = sum(1 for a in arr if 3 * hour <= a.t_s < 5 * hour)
    morning = sum(1 for a in arr if 9 * hour <= a.t_s < 11 * hour)
    assert morning > 1.8 * night


def test_offered_rate_counts_per_bin():
    arr = [Arrival(0.1, 8, 8), Arrival(0.5, 8, 8), Arrival(1.2, 8, 8)]
    starts, rates = offered_rate(arr, bin_s=1.0)
    assert list(starts) == [0.0, 1.0]
    assert list(rates) == [2.0, 1.0]


def test_bad_schedule_input_is_rejected():
    with pytest.raises(ValueError, match="compress"):
        from_requests([0.0], [1], [1], compress=0)
    with pytest.raises(ValueError, match="same length"):
        from_requests([0.0, 1.0], [1], [1])
    with pytest.raises(ValueError, match="usable"):
        from_rate_series([0, 600], [float("nan"), -1], compress=10, rate_scale=1)
    with pytest.raises(ValueError, match="bounds"):
        TokenShaping(prompt_min=10, prompt_max=5)


# --- endpoints ----------------------------------------------------------------------------------


def test_only_loopback_addresses_are_accepted():
    assert check_loopback("127.10.0.3:8000") == "127.10.0.3:8000"
    for bad in ["10.0.0.1:8000", "example.com:80", "127.0.0.1", "8.8.8.8:53"]:
        with pytest.raises(ValueError):
            check_loopback(bad)
    with pytest.raises(ValueError):
        StaticEndpoints(["192.168.1.1:8000"])


def test_ready_addresses_follow_endpointslice_conditions():
    slices = [
        {
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["127.10.0.1"], "conditions": {"ready": True}},
                {"addresses": ["127.10.0.2"], "conditions": {"ready": False}},
                {"addresses": ["127.10.0.3"], "conditions": {"ready": True, "terminating": True}},
                {"addresses": ["127.10.0.4"], "conditions": {}},  # unset ready means ready
                {"addresses": ["10.1.2.3"], "conditions": {"ready": True}},  # never off loopback
            ],
        },
        {"ports": [{"name": "metrics", "port": 9000}], "endpoints": [{"addresses": ["127.10.0.9"]}]},
    ]
    assert ready_addresses_from_slices(slices, "http") == ["127.10.0.1:8000", "127.10.0.4:8000"]


# --- replay against real HTTP servers --------------------------------------------------------------


class CompletionServer:
    """A real aiohttp server with `slots` concurrent requests, a bounded queue (429) and a service time."""

    def __init__(self, service_s: float = 0.02, slots: int = 4, max_queue: int = 1000):
        self.service_s = service_s
        self.slots = asyncio.Semaphore(slots)
        self.max_queue = max_queue
        self.waiting = 0
        self.bodies: list[dict] = []
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_get("/v1/models", self.models)
        self.server = TestServer(app, host="127.0.0.1")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if self.waiting >= self.max_queue:
            return web.json_response({"error": {"message": "queue full"}}, status=429)
        self.waiting += 1
        try:
            async with self.slots:
                await asyncio.sleep(self.service_s)
        finally:
            self.waiting -= 1
        return web.json_response(
            {"choices": [{"text": "x"}], "usage": {"completion_tokens": body["max_tokens"]}}
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def __aenter__(self) -> CompletionServer:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()


def burst(n: int, every_s: float = 0.005) -> list[Arrival]:
    return [Arrival(i * every_s, 8, 6) for i in range(n)]


async def test_replay_sends_every_request_and_records_latency():
    async with CompletionServer() as srv:
        rp = Replayer(StaticEndpoints([srv.address]), ReplayConfig(slo_s=5.0))
        recs = await rp.run(burst(40))
    assert len(recs) == 40 and len(srv.bodies) == 40
    assert all(r.status == 200 and r.slo_met for r in recs)
    assert all(r.latency_s is not None and r.latency_s >= srv.service_s for r in recs)
    assert all(r.output_tokens == 6 for r in recs)
    # discovered the served model name and sent unique prompts (no completion cache can answer)
    assert {b["model"] for b in srv.bodies} == {"tiny"}
    assert len({b["prompt"] for b in srv.bodies}) == 40
    s = summarize(recs, 5.0)
    assert s["slo_attainment"] == 1.0 and s["requests"] == 40 and s["by_status"] == {"200": 40}


async def test_least_outstanding_sends_more_to_the_faster_replica():
    # the slow replica holds each request for a second: while it does, the fast one takes the rest
    async with CompletionServer(service_s=0.005) as fast, CompletionServer(service_s=1.0) as slow:
        rp = Replayer(StaticEndpoints([fast.address, slow.address]), ReplayConfig(model="tiny"))
        await rp.run(burst(40, every_s=0.02))
    assert len(fast.bodies) + len(slow.bodies) == 40
    assert len(fast.bodies) > len(slow.bodies)


async def test_full_server_queue_answers_429_and_counts_as_slo_miss():
    async with CompletionServer(service_s=0.3, slots=1, max_queue=2) as srv:
        rp = Replayer(StaticEndpoints([srv.address]), ReplayConfig(model="tiny", slo_s=10))
        recs = await rp.run(burst(10, every_s=0.001))
    rejected = [r for r in recs if r.status == 429]
    assert rejected, "a one-slot server with a queue of 2 must reject part of a burst of 10"
    assert not any(r.slo_met for r in rejected)
    assert all(r.attempts == 1 for r in rejected)  # HTTP errors are not retried
    assert summarize(recs, 10)["slo_attainment"] == pytest.approx(1 - len(rejected) / 10)


class LateEndpoints:
    """No replica serving until `after_s`, then one: the cold-start case, seen by the client."""

    def __init__(self, address: str, after_s: float):
        self.address, self.after_s = address, after_s
        self.t0 = asyncio.get_running_loop().time()

    def ready(self) -> list[str]:
        return [self.address] if asyncio.get_running_loop().time() - self.t0 >= self.after_s else []


async def test_requests_queue_client_side_until_a_replica_serves():
    async with CompletionServer() as srv:
        rp = Replayer(LateEndpoints(srv.address, 0.4), ReplayConfig(model="tiny", queue_timeout_s=5))
        recs = await rp.run(burst(5))
    assert all(r.status == 200 for r in recs)
    # the wait for a replica is part of what the user saw
    assert all(r.latency_s >= 0.4 - r.scheduled_s for r in recs)


async def test_requests_fail_after_queue_timeout_when_nothing_serves():
    class Nothing:
        def ready(self) -> list[str]:
            return []

    rp = Replayer(Nothing(), ReplayConfig(model="tiny", queue_timeout_s=0.2))
    recs = await rp.run(burst(3))
    assert all(r.status == 0 and not r.slo_met and "no serving replica" in r.error for r in recs)
    assert all(r.latency_s >= 0.2 for r in recs)
    assert summarize(recs, 2.0)["by_status"] == {"no-answer": 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connection_refused_is_retried_on_another_replica():
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: a pod that just went away
    async with CompletionServer() as srv:
        rp = Replayer(StaticEndpoints([dead, srv.address]), ReplayConfig(model="tiny"))
        recs = await rp.run(burst(10, every_s=0.02))
        live = srv.address
    assert all(r.status == 200 and r.endpoint == live for r in recs)
    assert any(r.attempts > 1 for r in recs)


async def test_replay_is_bounded_in_count_and_time():
    async with CompletionServer() as srv:
        rp = Replayer(StaticEndpoints([srv.address]), ReplayConfig(model="tiny", max_requests=7))
        assert len(await rp.run(burst(50))) == 7
        rp = Replayer(StaticEndpoints([srv.address]), ReplayConfig(model="tiny", max_duration_s=0.05))
        recs = await rp.run([Arrival(0.0, 4, 4), Arrival(0.01, 4, 4), Arrival(5.0, 4, 4)])
    assert len(recs) == 2


def test_percentile_nearest_rank():
    assert percentile([], 99) is None
    vals = sorted(float(i) for i in range(1, 101))
    assert percentile(vals, 50) == 50.0
    assert percentile(vals, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_ready_addresses_from_service_selector_follow_pod_readiness():
    """The fallback for loopback pod IPs, which the API server refuses in EndpointSlices."""
    svc = {"spec": {"selector": {"app": "m", "role": "serving"},
                    "ports": [{"name": "http", "port": 8000, "target_port": "http"}]}}

    def p(ip: str, role: str, ready: bool, deleting: bool = False) -> dict:
        return {
            "metadata": {"labels": {"app": "m", "role": role}, "deletion_timestamp": "x" if deleting else None},
            "status": {"pod_ip": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            "spec": {"containers": [{"ports": [{"name": "http", "container_port": 8123}]}]},
        }

    pods = [p("127.10.0.1", "serving", True), p("127.10.0.2", "warm", True), p("127.10.0.3", "serving", False),
            p("127.10.0.4", "serving", True, deleting=True), p("10.0.0.5", "serving", True)]
    assert ready_addresses_from_pods(svc, pods, "http") == ["127.10.0.1:8123"]
    numeric = {"spec": {"selector": {"app": "m"}, "ports": [{"name": "http", "port": 80, "target_port": 9000}]}}
    assert ready_addresses_from_pods(numeric, [p("127.10.0.9", "warm", True)], "http") == ["127.10.0.9:9000"]
    assert ready_addresses_from_pods({"spec": {"selector": {}, "ports": []}}, pods) == []


def test_pod_addresses_only_when_routed_to_a_node_bridge_inside_preheats_namespace(monkeypatch):
    from preheat_lab.loadgen import endpoints as E

    routes = {"10.244.1.7": "phbr1", "10.244.9.9": "eth0", "192.0.2.1": ""}
    monkeypatch.setattr(E, "_route_dev", routes.__getitem__)
    monkeypatch.setenv("PREHEAT_NETNS", "preheat-test")
    assert check_loopback("10.244.1.7:8000") == "10.244.1.7:8000"
    for off_host in ("10.244.9.9:8000", "192.0.2.1:8000"):  # another device, or no route: never
        with pytest.raises(ValueError, match="not local"):
            check_loopback(off_host)
    monkeypatch.delenv("PREHEAT_NETNS")  # on the machine's own network stack, not even a bridge's pod
    with pytest.raises(ValueError, match="not local"):
        check_loopback("10.244.1.7:8000")


def test_the_route_device_is_read_from_the_kernel():
    from preheat_lab.loadgen.endpoints import _route_dev

    assert _route_dev("127.0.0.1") == "lo"


class StreamingServer:
    """Answers completions as server-sent events: an empty role chunk, the first text chunk after
    `first_s`, the rest after `rest_s`, a usage chunk and `[DONE]` (or, with `cut`, stops early)."""

    def __init__(self, first_s: float = 0.05, rest_s: float = 0.1, cut: bool = False):
        self.first_s, self.rest_s, self.cut = first_s, rest_s, cut
        self.bodies: list[dict] = []
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        self.server = TestServer(app, host="127.0.0.1")

    async def complete(self, request: web.Request) -> web.StreamResponse:
        import json

        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode())

        await send({"choices": [{"index": 0, "text": ""}]})
        await asyncio.sleep(self.first_s)
        await send({"choices": [{"index": 0, "text": "a"}]})
        await asyncio.sleep(self.rest_s)
        await send({"choices": [{"index": 0, "text": "b"}]})
        if not self.cut:
            await send({"choices": [], "usage": {"completion_tokens": 2}})
            await send("[DONE]")
        await resp.write_eof()
        return resp

    async def __aenter__(self) -> StreamingServer:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()


async def test_streamed_requests_record_the_first_tokens_arrival_and_ttft_attainment():
    async with StreamingServer() as srv:
        cfg = ReplayConfig(slo_s=5.0, model="tiny", stream=True)
        recs = await Replayer(StaticEndpoints([f"127.0.0.1:{srv.server.port}"]), cfg).run(burst(5))
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in srv.bodies)
    assert all(r.status == 200 and r.output_tokens == 2 for r in recs)
    # the first text chunk, not the empty one before it nor the end of the stream
    assert all(r.ttft_s >= srv.first_s and r.latency_s > r.ttft_s for r in recs)
    assert recs[0].to_dict()["ttft_s"] == recs[0].ttft_s
    assert summarize(recs, 5.0, ttft_slo_s=60.0)["ttft_slo_attainment"] == 1.0
    tight = summarize(recs, 5.0, ttft_slo_s=srv.first_s / 2)
    assert tight["ttft_slo_attainment"] == 0.0 and tight["slo_attainment"] == 1.0
    assert "ttft_slo_attainment" not in summarize([RequestRecord(0, 0.0, 8, 4, status=200, done_s=1.0)], 5.0)


async def test_a_stream_cut_before_done_is_no_answer():
    async with StreamingServer(first_s=0.0, rest_s=0.0, cut=True) as srv:
        cfg = ReplayConfig(slo_s=5.0, model="tiny", stream=True, queue_timeout_s=0.0)
        recs = await Replayer(StaticEndpoints([f"127.0.0.1:{srv.server.port}"]), cfg).run(burst(2))
    assert all(r.status == 0 and not r.slo_met and "DONE" in r.error for r in recs)
    assert all(r.ttft_s is None for r in recs)
