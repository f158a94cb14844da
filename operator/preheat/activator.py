"""`preheat activator`: hold and count the requests of an endpoint scaled to zero, then forward them.

Why it exists: the operator's request-rate signal is the model servers' own counters
(`preheat:requests_received_total`). At zero pods there is no model server, so there is no signal, and
a request sent then would fail on a Service without endpoints. While an InferenceEndpoint is at zero the
operator points its public Service at this proxy (as Knative does with its activator). The proxy counts
every request (`preheat:activator_requests_total`, which the operator reads from Prometheus to wake the
endpoint on demand) and holds it, retrying the private serving Service until a replica answers, so the
requests sent at zero are served late rather than lost.

A request is retried only while nothing has answered (connection refused, connect timeout): once a
replica has the request it is never sent again, since it may not be idempotent. Answers are relayed
chunk by chunk, so server-sent event streams (`stream=true`) reach the client as they are produced.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from yarl import URL

log = logging.getLogger("preheat.activator")

RETRY_FIRST_S = 0.25
RETRY_MAX_S = 2.0
BODY_CHUNK = 64 * 1024
HOLD_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are never relayed; any `Proxy-*` too.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})
# Set by the client library for the upstream connection itself.
NOT_SENT_UP = frozenset({"host", "content-length", "expect"})
# Left for the client to send or not: aiohttp would add them otherwise (Accept-Encoding would get the
# client a compressed answer it never asked for, as answers are relayed undecoded).
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


@dataclass
class ActivatorMetrics:
    """The activator's own series, in its own registry, each with the `endpoint` label set."""

    registry: CollectorRegistry
    requests: Counter
    waiting: Gauge
    hold_seconds: Histogram
    timeouts: Counter

    @classmethod
    def create(cls, endpoint: str, registry: CollectorRegistry | None = None) -> ActivatorMetrics:
        reg = registry if registry is not None else CollectorRegistry()
        label = ["endpoint"]
        return cls(
            registry=reg,
            requests=Counter("preheat:activator_requests_total",
                             "Requests that arrived at the activator (before holding); the request-rate "
                             "signal while no model server runs.", label, registry=reg).labels(endpoint),
            waiting=Gauge("preheat:activator_requests_waiting",
                          "Requests held now: not yet sent to a serving replica.", label,
                          registry=reg).labels(endpoint),
            hold_seconds=Histogram("preheat:activator_hold_seconds",
                                   "Arrival to the request sent to a serving replica.", label,
                                   registry=reg, buckets=HOLD_BUCKETS).labels(endpoint),
            timeouts=Counter("preheat:activator_timeouts_total",
                             "Requests answered 504: no serving replica answered within the hold timeout.",
                             label, registry=reg).labels(endpoint),
        )


class Hold:
    """One held request: owns a slot of --max-held and the waiting gauge until released."""

    def __init__(self, activator: Activator) -> None:
        self.activator = activator
        self.started = time.monotonic()
        self.released = False
        activator.held += 1
        activator.metrics.waiting.inc()

    def connected(self) -> None:
        """The request reached a serving replica: record how long it was held, then release it."""
        if not self.released:
            self.activator.metrics.hold_seconds.observe(time.monotonic() - self.started)
        self.release()

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.activator.held -= 1
            self.activator.metrics.waiting.dec()


@dataclass
class Activator:
    upstream: str
    endpoint: str
    hold_timeout_s: float
    max_held: int
    max_body_bytes: int
    metrics: ActivatorMetrics
    held: int = 0
    session: aiohttp.ClientSession | None = field(default=None, repr=False)

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        """Count, hold until a serving replica answers, relay its answer."""
        self.metrics.requests.inc()
        if self.held >= self.max_held:
            return error_response(503, f"the activator already holds {self.max_held} requests; retry",
                                  "activator_overloaded", {"Retry-After": "1"})
        hold = Hold(self)
        try:
            body = await read_body(request, self.max_body_bytes)
            if body is None:
                return error_response(413, f"request body is over {self.max_body_bytes} bytes",
                                      "request_too_large")
            answered = await self.send_up(request, body, hold)
        finally:
            hold.release()
        if isinstance(answered, web.StreamResponse):
            return answered
        return await relay(request, answered)

    async def send_up(self, request: web.Request, body: bytes,
                      hold: Hold) -> aiohttp.ClientResponse | web.Response:
        """Try the upstream until something answers (backing off) or the hold times out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_timeout_s
        for delay in backoff():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return self.timed_out()
            if client_gone(request):
                return web.Response(status=499)
            try:
                return await self.attempt(request, body, hold, remaining)
            except aiohttp.ClientSSLError as exc:
                return upstream_failed(request, exc)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
                pass  # nothing answered yet: no replica is ready
            except aiohttp.ClientError as exc:
                return upstream_failed(request, exc)
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        raise AssertionError("backoff() never ends")

    async def attempt(self, request: web.Request, body: bytes, hold: Hold,
                      connect_timeout_s: float) -> aiohttp.ClientResponse:
        assert self.session is not None, "the client session starts with the app"
        return await self.session.request(
            request.method, upstream_url(self.upstream, request.raw_path),
            headers=headers_up(request.headers), data=body or None, allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=None),
            trace_request_ctx=hold)

    def timed_out(self) -> web.Response:
        self.metrics.timeouts.inc()
        log.info("endpoint %s: no serving replica answered within %g s", self.endpoint, self.hold_timeout_s)
        return error_response(504, f"endpoint {self.endpoint}: no serving replica answered within "
                                   f"{self.hold_timeout_s:g} s", "activator_timeout")


def backoff() -> Iterable[float]:
    """0.25 s, 0.5 s, 1 s, then 2 s forever."""
    delay = RETRY_FIRST_S
    while True:
        yield delay
        delay = min(delay * 2, RETRY_MAX_S)


def client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def upstream_failed(request: web.Request, exc: BaseException) -> web.Response:
    log.warning("%s %s: upstream failed before answering: %r", request.method, request.path, exc)
    return error_response(502, f"the serving replica failed before answering: {exc}",
                          "activator_upstream_error")


def error_response(status: int, message: str, type_: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_}}, status=status, headers=headers)


async def read_body(request: web.Request, limit: int) -> bytes | None:
    """The whole request body, or None when it is over `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(BODY_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def upstream_url(upstream: str, raw_path: str) -> URL:
    """The upstream base (its own path prefix kept) joined with the request's path and query, unaltered."""
    return URL(upstream.rstrip("/") + raw_path, encoded=True)


def _relayed(headers: CIMultiDictProxy[str] | CIMultiDict[str], dropped: frozenset[str]) -> CIMultiDict[str]:
    named_by_connection = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    return CIMultiDict(
        (k, v) for k, v in headers.items()
        if (low := k.lower()) not in HOP_BY_HOP and low not in dropped and low not in named_by_connection
        and not low.startswith("proxy-"))


def headers_up(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return _relayed(headers, NOT_SENT_UP)


def headers_down(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Upstream's headers for the client; Content-Length only when upstream sent one (not chunked)."""
    return _relayed(headers, frozenset())


async def relay(request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    """Upstream's status, headers and body, each chunk written as it arrives. An upstream failure
    mid-body aborts the client's connection (the client sees a truncated answer, not a complete one)."""
    async with upstream:
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                 headers=headers_down(upstream.headers))
        await out.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                log.warning("%s %s: upstream failed mid-answer, not retried: %r",
                            request.method, request.path, exc)
                if request.transport is not None:
                    request.transport.abort()
                return out
            if not chunk:
                break
            try:
                await out.write(chunk)
            except ConnectionError:
                return out  # the client went away
        await out.write_eof()
    return out


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def metrics_page(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ACTIVATOR].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def on_request_headers_sent(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                                  _params: object) -> None:
    """The request reached a replica: it is no longer held."""
    if isinstance(ctx.trace_request_ctx, Hold):
        ctx.trace_request_ctx.connected()


async def client_session(app: web.Application) -> AsyncIterator[None]:
    activator = app[ACTIVATOR]
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(on_request_headers_sent)
    activator.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=SKIP_AUTO_HEADERS, trace_configs=[trace],
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
    yield
    await activator.session.close()


ACTIVATOR = web.AppKey("activator", Activator)


def make_app(upstream: str, endpoint: str, hold_timeout_s: float, max_held: int, max_body_bytes: int,
             registry: CollectorRegistry | None = None) -> web.Application:
    activator = Activator(upstream=upstream, endpoint=endpoint, hold_timeout_s=hold_timeout_s,
                          max_held=max_held, max_body_bytes=max_body_bytes,
                          metrics=ActivatorMetrics.create(endpoint, registry))
    app = web.Application()
    app[ACTIVATOR] = activator
    app.cleanup_ctx.append(client_session)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/metrics", metrics_page, allow_head=False)
    app.router.add_route("*", "/{tail:.*}", activator.proxy)
    return app


def upstream_arg(value: str) -> str:
    """argparse type of --upstream: an http(s) URL with a host."""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL with a host "
                                         "(e.g. http://NAME-serving.NAMESPACE.svc:8000)")
    return value


def positive(kind: type[int] | type[float]):
    def parse(value: str) -> int | float:
        number = kind(value)
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{value!r} is not positive")
        return number
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="preheat activator", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, type=upstream_arg,
                   help="the serving pods' private Service, e.g. http://NAME-serving.NAMESPACE.svc:8000")
    p.add_argument("--endpoint", required=True, help="the InferenceEndpoint's name (the metrics' label)")
    p.add_argument("--port", type=int, default=8012, help="listen on this port (default: %(default)s)")
    p.add_argument("--hold-timeout-seconds", type=positive(float), default=600.0,
                   help="answer 504 when no replica answered a request within this (default: %(default)s)")
    p.add_argument("--max-held", type=positive(int), default=1000,
                   help="answer 503 beyond this many held requests (default: %(default)s)")
    p.add_argument("--max-body-bytes", type=positive(int), default=64 * 1024 * 1024,
                   help="answer 413 to a larger request body (default: %(default)s)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = make_app(args.upstream, args.endpoint, args.hold_timeout_seconds, args.max_held,
                   args.max_body_bytes)
    log.info("activator for endpoint %s on :%d: holding requests for %s up to %g s (at most %d at once)",
             args.endpoint, args.port, args.upstream, args.hold_timeout_seconds, args.max_held)
    # SIGTERM: stop accepting, then let held and streaming requests finish (up to a full hold).
    web.run_app(app, port=args.port, shutdown_timeout=args.hold_timeout_seconds + 5, print=None,
                access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
