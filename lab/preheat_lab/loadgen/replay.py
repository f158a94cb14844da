"""Replay a schedule of requests against serving replicas and record what each user experienced.

Each arrival becomes a real `POST /v1/completions` at its scheduled offset. Latency is measured from
the *scheduled* time, so any wait the client adds (no replica serving, retries) is part of it, the
way a user would see it.

Requests that find no ready serving replica wait in a client-side queue (like Knative's activator)
for at most `queue_timeout_s`; if none appears they are recorded as failed with status 0 and count
as SLO misses. A connection refused or reset (a pod that just left the Service) is retried on
another ready replica while the request's deadline allows; HTTP errors (429 from a full server
queue, 503 while draining) are recorded, not retried, and are SLO misses.

With `stream=True` each request asks for server-sent events and the first chunk that carries text
marks its first token: time to first token (TTFT) from the scheduled time, as a user sees it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import aiohttp

from .endpoints import EndpointSource, check_loopback
from .schedule import Arrival

log = logging.getLogger(__name__)

# Words for synthetic prompts: short and common so the byte-level tokenizer maps most to ~1 token.
_WORDS = ["the", "model", "serves", "a", "request", "with", "a", "warm", "pool", "of", "replicas", "and", "a", "cold", "start", "when", "load", "rises", "before", "the", "ramp", "the", "forecast", "sees", "the", "daily", "pattern", "so", "capacity", "is", "in", "place"]


def prompt_text(index: int, tokens: int) -> str:
    """A prompt of about `tokens` tokens, unique per request so no completion cache can answer it."""
    words = [f"r{index}"]
    words += [_WORDS[(index + i) % len(_WORDS)] for i in range(max(0, tokens - 1))]
    return " ".join(words)


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds since the replay started."""

    index: int
    scheduled_s: float
    prompt_tokens: int
    max_tokens: int
    sent_s: float | None = None
    done_s: float | None = None
    status: int = 0  # HTTP status; 0 = never answered (no replica, timeout, connection error)
    endpoint: str | None = None
    attempts: int = 0
    output_tokens: int = 0
    error: str | None = None
    slo_met: bool = False
    first_token_s: float | None = None  # streamed requests: when the first text chunk arrived

    @property
    def latency_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.scheduled_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.scheduled_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["latency_s"] = self.latency_s
        d["ttft_s"] = self.ttft_s
        return d


@dataclass
class ReplayConfig:
    """Bounds and SLO of a replay. Every replay is bounded in request count and in time."""

    slo_s: float = 2.0
    queue_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    max_requests: int = 20_000
    max_duration_s: float = 900.0
    model: str | None = None  # `model` field; None = ask the first replica's /v1/models
    temperature: float = 0.0
    stream: bool = False  # server-sent events: records the first token's arrival (TTFT)

    def __post_init__(self) -> None:
        if self.slo_s <= 0 or self.queue_timeout_s < 0 or self.request_timeout_s <= 0:
            raise ValueError("slo_s and request_timeout_s must be > 0, queue_timeout_s >= 0")
        if self.max_requests < 1 or self.max_duration_s <= 0:
            raise ValueError("max_requests must be >= 1 and max_duration_s > 0")


class _StreamCut(Exception):
    """A streamed answer that ended before `[DONE]`."""


@dataclass
class _Outstanding:
    counts: dict[str, int] = field(default_factory=dict)

    def pick(self, ready: Sequence[str], rr: int) -> str:
        # least outstanding; ties broken round-robin so idle replicas share the load evenly
        n = len(ready)
        order = [ready[(rr + i) % n] for i in range(n)]
        return min(order, key=lambda a: self.counts.get(a, 0))


class Replayer:
    """Sends a schedule of arrivals to the addresses an EndpointSource says are ready."""

    def __init__(self, source: EndpointSource, config: ReplayConfig | None = None):
        self.source = source
        self.config = config or ReplayConfig()
        self.records: list[RequestRecord] = []
        self._outstanding = _Outstanding()
        self._rr = itertools.count()
        self._t0: float | None = None
        self._model: str | None = self.config.model

    # -- progress -----------------------------------------------------------------------------
    def now(self) -> float:
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def in_flight(self) -> int:
        return sum(1 for r in self.records if r.done_s is None)

    def window_stats(self, window_s: float = 10.0) -> dict:
        """Offered rate, completions, SLO attainment and p99 latency over the last `window_s`."""
        now = self.now()
        lo = now - window_s
        offered = sum(1 for r in self.records if r.scheduled_s >= lo)
        done = [r for r in self.records if r.done_s is not None and r.done_s >= lo]
        lat = sorted(r.latency_s for r in done if r.latency_s is not None)
        p99 = lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)] if lat else None
        met = sum(1 for r in done if r.slo_met)
        return {
            "t_s": now,
            "offered_rps": offered / window_s,
            "completed": len(done),
            "slo_attainment": (met / len(done)) if done else None,
            "p99_latency_s": p99,
            "in_flight": self.in_flight(),
            "ready_endpoints": len(self.source.ready()),
        }

    # -- the replay -----------------------------------------------------------------------------
    async def run(self, arrivals: Sequence[Arrival]) -> list[RequestRecord]:
        """Replay `arrivals` (bounded by max_requests and max_duration_s); returns every record."""
        cfg = self.config
        todo = sorted(arrivals, key=lambda a: a.t_s)[: cfg.max_requests]
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        tasks: list[asyncio.Task] = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self._t0 = time.monotonic()
            for i, a in enumerate(todo):
                if a.t_s > cfg.max_duration_s:
                    break
                delay = a.t_s - self.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                rec = RequestRecord(i, a.t_s, a.prompt_tokens, a.max_tokens)
                self.records.append(rec)
                tasks.append(asyncio.create_task(self._one(session, rec)))
            # every request has its own deadline, so this wait is bounded too
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        return self.records

    async def _discover_model(self, session: aiohttp.ClientSession, address: str) -> None:
        try:
            async with session.get(f"http://{address}/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    data = (await r.json()).get("data") or []
                    if data:
                        self._model = data[0].get("id")
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            log.debug("model discovery at %s failed: %s", address, e)

    async def _wait_for_endpoint(self, deadline: float) -> list[str]:
        while True:
            ready = self.source.ready()
            if ready:
                return ready
            if self.now() >= deadline:
                return []
            await asyncio.sleep(0.05)

    async def _one(self, session: aiohttp.ClientSession, rec: RequestRecord) -> None:
        cfg = self.config
        queue_deadline = rec.scheduled_s + cfg.queue_timeout_s
        refused: set[str] = set()  # replicas that refused this request: try the others first
        try:
            while True:
                ready = await self._wait_for_endpoint(queue_deadline)
                if not ready:
                    rec.error = rec.error or f"no serving replica within {cfg.queue_timeout_s:g} s"
                    break
                candidates = [a for a in ready if a not in refused] or ready
                address = check_loopback(self._outstanding.pick(candidates, next(self._rr)))
                if self._model is None and cfg.model is None:
                    await self._discover_model(session, address)
                rec.attempts += 1
                rec.endpoint = address
                rec.sent_s = rec.sent_s if rec.sent_s is not None else self.now()
                retry = await self._send(session, rec, address)
                refused.add(address)
                if not retry or self.now() >= queue_deadline:
                    break
        except Exception as e:  # never let one request break the replay
            rec.error = f"{type(e).__name__}: {e}"
        if rec.done_s is None:
            rec.done_s = self.now()
        rec.slo_met = rec.status == 200 and (rec.latency_s or math.inf) <= cfg.slo_s

    async def _read_stream(self, r: aiohttp.ClientResponse, rec: RequestRecord) -> None:
        """Server-sent events until `[DONE]`: the first chunk with text is the first token; the usage
        chunk (stream_options.include_usage) gives the tokens generated. A stream cut short is no
        answer (status 0): the user did not get the completion."""
        chunks = 0
        try:
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                data = json.loads(payload)
                if any((c.get("text") or "") for c in data.get("choices") or []):
                    chunks += 1
                    if rec.first_token_s is None:
                        rec.first_token_s = self.now()
                usage = data.get("usage") or {}
                if usage.get("completion_tokens") is not None:
                    rec.output_tokens = int(usage["completion_tokens"])
            else:
                raise aiohttp.ClientPayloadError("stream ended without [DONE]")
        except (aiohttp.ClientPayloadError, ValueError) as e:
            rec.status, rec.first_token_s = 0, None
            raise _StreamCut(f"{type(e).__name__}: {e}") from e
        rec.output_tokens = rec.output_tokens or chunks
        if rec.first_token_s is None:  # an answer with no text: its end is the first thing the user sees
            rec.first_token_s = self.now()

    async def _send(self, session: aiohttp.ClientSession, rec: RequestRecord, address: str) -> bool:
        """One attempt; True when the request should be retried on another replica."""
        body = {"prompt": prompt_text(rec.index, rec.prompt_tokens), "max_tokens": rec.max_tokens,
                "temperature": self.config.temperature}
        if self._model:
            body["model"] = self._model
        if self.config.stream:
            body.update(stream=True, stream_options={"include_usage": True})
        self._outstanding.counts[address] = self._outstanding.counts.get(address, 0) + 1
        try:
            async with session.post(f"http://{address}/v1/completions", json=body) as r:
                rec.status = r.status
                if r.status == 200 and self.config.stream:
                    try:
                        await self._read_stream(r, rec)
                        rec.error = None
                    except _StreamCut as e:
                        rec.error = str(e)
                elif r.status == 200:
                    data = await r.json()
                    rec.output_tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
                    rec.error = None
                else:
                    text = await r.text()
                    rec.error = f"HTTP {r.status}: {text[:200]}"
                rec.done_s = self.now()
                return False
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, ConnectionResetError) as e:
            # the replica left (demoted, deleted) between our EndpointSlice read and the send
            rec.error = f"{type(e).__name__}: {e}"
            await asyncio.sleep(0.1)
            return True
        except TimeoutError:
            rec.error = f"timeout after {self.config.request_timeout_s:g} s"
            rec.done_s = self.now()
            return False
        finally:
            self._outstanding.counts[address] -= 1


def summarize(records: Sequence[RequestRecord], slo_s: float, ttft_slo_s: float | None = None) -> dict:
    """SLO attainment, latency percentiles and outcome counts over a whole replay; with `ttft_slo_s`
    and streamed requests also TTFT attainment (first token within it of the scheduled time ÷ all
    requests sent) and TTFT percentiles over the requests answered 200."""
    n = len(records)
    lat = sorted(r.latency_s for r in records if r.status == 200 and r.latency_s is not None)
    ttft = sorted(r.ttft_s for r in records if r.status == 200 and r.ttft_s is not None)
    ttft_part = {}
    if ttft:
        met = sum(1 for r in records if r.status == 200 and r.ttft_s is not None and ttft_slo_s is not None
                  and r.ttft_s <= ttft_slo_s)
        ttft_part = {"ttft_slo_s": ttft_slo_s, "ttft_slo_attainment": (met / n) if n and ttft_slo_s else None,
                     "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99)}
    by_status: dict[str, int] = {}
    for r in records:
        key = str(r.status) if r.status else "no-answer"
        by_status[key] = by_status.get(key, 0) + 1
    return {
        "requests": n,
        "slo_s": slo_s,
        "slo_met": sum(1 for r in records if r.slo_met),
        "slo_attainment": (sum(1 for r in records if r.slo_met) / n) if n else None,
        "ok": len(lat),
        "p50_latency_s": percentile(lat, 50),
        "p99_latency_s": percentile(lat, 99),
        "by_status": by_status,
        "retried": sum(1 for r in records if r.attempts > 1),
        **ttft_part,
    }


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return float(sorted_values[k])
