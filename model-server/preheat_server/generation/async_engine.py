"""Runs the single-threaded LLMEngine in one dedicated thread and connects it to asyncio handlers.

Handlers call `generate()` (an async iterator of RequestOutput). Adds and aborts travel to the engine
thread through a command list guarded by a condition variable; the thread sleeps on it when there is
no work (it never spins) and otherwise runs `engine.step()` back to back. Each step's outputs are
handed to the event loop in one `call_soon_threadsafe`, which puts them on per-request queues.

This is also where the engine-side metrics are observed (TTFT, inter-token latency, end-to-end,
tokens, batch size, KV usage, prefix cache, preemptions), timed in the engine thread when tokens
come out of a step, so event-loop lag does not distort them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from preheat_server.metrics import ServerMetrics

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """More requests are admitted than the engine runs plus the queue holds."""


class EngineStepError(RuntimeError):
    """An engine step failed; the requests in it were aborted (the server keeps serving)."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shutdown or a failed step); no new requests are taken."""


@dataclass
class _Tracked:
    """Engine-thread bookkeeping of one request (only the engine thread touches it)."""

    arrival: float
    queue: asyncio.Queue
    first_token: float | None = None
    last_token: float | None = None
    num_output_tokens: int = 0


@dataclass
class _Command:
    kind: str                      # "add" | "abort"
    request_id: str
    prompt_token_ids: list[int] = field(default_factory=list)
    params: Any = None
    tracked: _Tracked | None = None
    reason: str = "abort"          # for "abort": "stop" when a stop string ended it, else "abort"


class AsyncEngine:
    """Owns the engine thread; `generate()` is the only way requests reach the engine."""

    def __init__(self, engine: Any, metrics: ServerMetrics, max_num_seqs: int, max_queue: int) -> None:
        self._engine = engine
        self._metrics = metrics
        self._name = metrics.model_name
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._commands: list[_Command] = []
        self._stopping = False
        self._dead: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tracked: dict[str, _Tracked] = {}     # engine thread only
        self.num_in_flight = 0                       # event loop only: admitted, not yet finished
        self._stopped_early: set[str] = set()       # event loop only: ended by a stop string
        self._counters = {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_preemptions": 0}
        self._sync_counter_baseline()
        metrics.max_num_seqs.labels(self._name).set(max_num_seqs)
        metrics.max_queue.labels(self._name).set(max_queue)

    # ---- event-loop side ----

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    @property
    def capacity(self) -> int:
        """Requests admitted at once: a place in the running batch or in the bounded queue."""
        return self.max_num_seqs + self.max_queue

    def check_admission(self) -> None:
        """Raise QueueFullError if one more request would exceed max_num_seqs + max_queue."""
        if self._dead is not None:
            raise EngineDeadError(f"engine stopped: {self._dead}")
        if self.num_in_flight >= self.capacity:
            raise QueueFullError(f"{self.num_in_flight} requests in flight; the server admits at most "
                                 f"{self.capacity} (max_num_seqs {self.max_num_seqs} + max_queue {self.max_queue})")

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: Any) -> AsyncIterator[Any]:
        """Yield the engine's RequestOutputs for one request until it finishes.

        Leaving the iteration early (client disconnect, stop string found, cancellation) aborts the
        request in the engine, which frees its KV blocks at once.
        """
        self.check_admission()
        tracked = _Tracked(arrival=time.perf_counter(), queue=asyncio.Queue())
        self.num_in_flight += 1
        finished = False
        try:
            self._submit(_Command("add", request_id, list(prompt_token_ids), params, tracked))
            while True:
                item = await tracked.queue.get()
                if isinstance(item, BaseException):
                    finished = True   # rejected or failed inside the engine: nothing to abort
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:
                reason = "stop" if request_id in self._stopped_early else "abort"
                # When shutting down, the engine goes away with its blocks: nothing to abort.
                with contextlib.suppress(EngineDeadError):
                    self._submit(_Command("abort", request_id, reason=reason))
            self._stopped_early.discard(request_id)
            self.num_in_flight -= 1

    def mark_stopped(self, request_id: str) -> None:
        """The caller found a stop string: the coming abort is a normal finish (reason "stop")."""
        self._stopped_early.add(request_id)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _submit(self, cmd: _Command) -> None:
        with self._cond:
            if self._stopping:
                raise EngineDeadError("engine is shutting down")
            self._commands.append(cmd)
            self._cond.notify()

    def _deliver(self, items: list[tuple[asyncio.Queue, Any]]) -> None:
        for queue, item in items:
            queue.put_nowait(item)

    # ---- engine thread ----

    def _run(self) -> None:
        engine = self._engine
        try:
            while True:
                with self._cond:
                    while not self._commands and not self._stopping and not engine.has_unfinished_requests():
                        self._cond.wait()
                    if self._stopping:
                        break
                    commands, self._commands = self._commands, []
                deliveries = self._apply(commands)
                if engine.has_unfinished_requests():
                    try:
                        deliveries += self._step()
                    except Exception as exc:
                        deliveries += self._recover(exc)
                self._update_gauges()
                if deliveries:
                    self._loop.call_soon_threadsafe(self._deliver, deliveries)
        except BaseException as exc:  # a failed step leaves the engine in an unknown state: fail everything
            log.exception("engine thread failed")
            self._dead = exc
            err = EngineDeadError(f"engine failed: {exc!r}")
            failed = [(t.queue, err) for t in self._tracked.values()]
            with self._cond:
                failed += [(c.tracked.queue, err) for c in self._commands if c.tracked is not None]
                self._commands = []
            self._tracked.clear()
            if failed and self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._deliver, failed)

    def _recover(self, exc: Exception) -> list[tuple[asyncio.Queue, Any]]:
        """A step raised: fail the requests in the engine (aborting them frees their KV blocks) and
        keep serving, so one pathological request costs its batch an error, not the replica its life.
        If aborting fails too, the engine is beyond repair and the thread dies (see _run)."""
        log.exception("engine step failed; failing the %d requests in the engine", len(self._tracked))
        self._metrics.engine_step_failures.labels(self._name).inc()
        err = EngineStepError(f"the engine failed while running this request: {exc!r}")
        out = []
        for request_id, tracked in list(self._tracked.items()):
            self._engine.abort_request(request_id)
            self._metrics.request_success.labels(self._name, "abort").inc()
            out.append((tracked.queue, err))
        self._tracked.clear()
        return out

    def _apply(self, commands: list[_Command]) -> list[tuple[asyncio.Queue, Any]]:
        out: list[tuple[asyncio.Queue, Any]] = []
        for cmd in commands:
            if cmd.kind == "add":
                try:
                    self._engine.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params)
                except ValueError as exc:      # the engine's verdict on bad input: a 400 upstream
                    out.append((cmd.tracked.queue, exc))
                    continue
                self._tracked[cmd.request_id] = cmd.tracked
                self._metrics.prompt_tokens.labels(self._name).inc(len(cmd.prompt_token_ids))
            elif cmd.kind == "abort":
                tracked = self._tracked.pop(cmd.request_id, None)
                if tracked is not None:
                    self._engine.abort_request(cmd.request_id)
                    self._metrics.request_success.labels(self._name, cmd.reason).inc()
                    if cmd.reason == "stop":
                        latency = time.perf_counter() - tracked.arrival
                        self._metrics.e2e_request_latency.labels(self._name).observe(latency)
        return out

    def _step(self) -> list[tuple[asyncio.Queue, Any]]:
        outputs = self._engine.step()
        now = time.perf_counter()
        m, name = self._metrics, self._name
        out: list[tuple[asyncio.Queue, Any]] = []
        for o in outputs:
            tracked = self._tracked.get(o.request_id)
            if tracked is None:       # aborted meanwhile (its final "abort" output has no reader)
                continue
            n_new = len(o.new_token_ids)
            if n_new:
                if tracked.first_token is None:
                    m.time_to_first_token.labels(name).observe(now - tracked.arrival)
                    tracked.first_token = now
                else:
                    gap = (now - tracked.last_token) / n_new
                    for _ in range(n_new):
                        m.inter_token_latency.labels(name).observe(gap)
                tracked.last_token = now
                tracked.num_output_tokens += n_new
                m.generation_tokens.labels(name).inc(n_new)
            if o.finished:
                del self._tracked[o.request_id]
                m.e2e_request_latency.labels(name).observe(now - tracked.arrival)
                m.request_success.labels(name, o.finish_reason or "stop").inc()
            out.append((tracked.queue, o))
        stats = self._engine.stats()
        if stats.last_batch_size:
            m.batch_size.labels(name).observe(stats.last_batch_size)
        return out

    def _sync_counter_baseline(self) -> None:
        """Engine counters are cumulative; export only what happens after this point (after warm-up)."""
        stats = self._engine.stats()
        for key in self._counters:
            self._counters[key] = int(getattr(stats, key))

    def _update_gauges(self) -> None:
        stats = self._engine.stats()
        m, name = self._metrics, self._name
        m.num_requests_running.labels(name).set(stats.num_running)
        with self._cond:
            queued_adds = sum(1 for c in self._commands if c.kind == "add")
        m.num_requests_waiting.labels(name).set(stats.num_waiting + queued_adds)
        m.kv_cache_usage.labels(name).set(stats.kv_cache_usage)
        for key, counter in (("prefix_cache_queries", m.prefix_cache_queries),
                             ("prefix_cache_hits", m.prefix_cache_hits),
                             ("num_preemptions", m.num_preemptions)):
            value = int(getattr(stats, key))
            if value > self._counters[key]:
                counter.labels(name).inc(value - self._counters[key])
            self._counters[key] = value
