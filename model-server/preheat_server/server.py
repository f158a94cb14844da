"""Runs one model server: bind, load in the background, warm up, serve, drain on SIGTERM, exit 0.

`Server` is used by the CLI and, in-process, by tests and benchmarks; loaders can be injected so a
test process loads the tiny model once and gives each server its own engine.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from preheat_server.config import ServerConfig
from preheat_server.embeddings.model import BUILTIN_EMBEDDING_MODELS, EmbeddingModel, is_embedding_model
from preheat_server.embeddings.service import EmbeddingService
from preheat_server.generation.async_engine import AsyncEngine
from preheat_server.generation.completion_cache import CompletionCache
from preheat_server.generation.service import GenerationService
from preheat_server.http.app import build_app
from preheat_server.http.context import ServerContext
from preheat_server.lifecycle import Lifecycle
from preheat_server.metrics import ServerMetrics
from preheat_server.sampling import SamplingParams

log = logging.getLogger(__name__)

WARMUP_PROMPT = "Warm-up: the replica loads its weights and runs one request before it takes traffic."


def served_name(config: ServerConfig) -> str:
    if config.served_model_name:
        return config.served_model_name
    name = config.model.removeprefix("sentence-transformers/")
    return name if name in ("tiny", "small", *BUILTIN_EMBEDDING_MODELS) else Path(config.model).name


def default_generation_loader(config: ServerConfig) -> Any:
    from preheat_server.models import load_model

    return load_model(config.model, device=config.device, precision=config.precision)


def default_embedding_loader(name: str, precision: str | None) -> EmbeddingModel:
    return EmbeddingModel.load(name, device="cpu", precision=precision)


@dataclass
class _Loaded:
    engine: Any = None
    loaded: Any = None
    embedding: EmbeddingModel | None = None


def _settle(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future:
    """Run blocking work off the event loop in a daemon thread, so SIGTERM during a load still exits."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, fut, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, fut, result, None)

    threading.Thread(target=target, name="model-loader", daemon=True).start()
    return fut


class Server:
    def __init__(self, config: ServerConfig, *,
                 generation_loader: Callable[[ServerConfig], Any] = default_generation_loader,
                 embedding_loader: Callable[[str, str | None], EmbeddingModel] = default_embedding_loader,
                 started_at: float | None = None) -> None:
        config.validate()
        self.config = config
        self._generation_loader = generation_loader
        self._embedding_loader = embedding_loader
        self.metrics = ServerMetrics.create(served_name(config))
        self.lifecycle = Lifecycle(self.metrics, started_at)
        self.ctx = ServerContext(config, self.metrics, self.lifecycle, served_name(config), created=int(time.time()))
        self.app = build_app(self.ctx)
        self.async_engine: AsyncEngine | None = None
        self._runner: web.AppRunner | None = None
        self._load_task: asyncio.Task | None = None
        self.load_error: BaseException | None = None
        self.port: int | None = None
        self._stopped = asyncio.Event()

    # ---- start ----

    async def start(self) -> None:
        """Bind first (liveness works at once), then load in the background."""
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.bind_host(), self.config.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("listening on http://%s:%d (loading %s)", self.config.bind_host(), self.port, self.config.model)
        self._load_task = asyncio.get_running_loop().create_task(self._load(), name="load")

    async def wait_ready(self) -> None:
        """For tests and benchmarks: until ready; re-raises a failed load."""
        assert self._load_task is not None, "start() first"
        await asyncio.shield(self._load_task)
        if self.load_error is not None:
            raise self.load_error

    async def _load(self) -> None:
        config = self.config
        embeddings_only = is_embedding_model(config.model)
        try:
            loaded = await _in_daemon_thread(lambda: self._load_blocking(embeddings_only))
        except asyncio.CancelledError:
            raise   # shut down while loading: not a failure
        except BaseException as exc:
            self.load_error = exc
            log.error("loading %s failed: %s", config.model, exc)
            self._stopped.set()
            return
        if self.lifecycle.state != "loading":
            return   # SIGTERM arrived during the load
        if loaded.engine is not None:
            self.async_engine = AsyncEngine(loaded.engine, self.metrics, config.max_num_seqs, config.max_queue)
            self.async_engine.start()
            self.ctx.generation = GenerationService(loaded.loaded, self.async_engine,
                                                    CompletionCache(config.completion_cache_size), self.metrics)
        if loaded.embedding is not None:
            service = EmbeddingService(loaded.embedding, self.metrics, config.embedding_max_batch_size,
                                       config.embedding_max_queue_delay_ms, config.max_queue)
            if embeddings_only:   # --served-model-name renames the only model there is
                service.name = self.ctx.served_model_name
            service.start()
            self.ctx.embeddings = service
            self.metrics.prime_embeddings(loaded.embedding.name)
        self._report_kernels(loaded)
        self.lifecycle.mark_ready()

    def _report_kernels(self, loaded: _Loaded) -> None:
        """Say which kernels each model runs on this CPU: one log line and one info series per model."""
        models = [(self.metrics.model_name, loaded.loaded)]
        if loaded.embedding is not None:   # embedding series carry the embedding model's name
            models.append((loaded.embedding.name, loaded.embedding))
        for name, model in models:
            report = getattr(model, "kernels", None)
            if report is None:
                continue   # no model, or a test's stand-in loader
            log.log(logging.WARNING if report.warning else logging.INFO, "%s %s", name, report.line())
            self.metrics.set_kernels(name, report)

    def _load_blocking(self, embeddings_only: bool) -> _Loaded:
        """Weights, engine, KV cache, and one warm-up request through each model (not counted in metrics)."""
        config = self.config
        out = _Loaded()
        if not embeddings_only:
            from preheat_server.engine import EngineConfig, LLMEngine

            out.loaded = self._generation_loader(config)
            out.engine = LLMEngine(out.loaded, EngineConfig(
                max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                block_size=config.block_size, num_kv_blocks=config.kv_cache_blocks,
                kv_cache_memory_fraction=config.kv_cache_memory_fraction,
                enable_prefix_caching=config.enable_prefix_caching, target_itl_ms=config.target_itl_ms,
                min_step_ms=config.min_step_ms))
            if config.warmup:
                ids = out.loaded.tokenizer.encode(WARMUP_PROMPT)
                out.engine.generate([ids], SamplingParams(max_tokens=2, ignore_eos=True))
        name = config.model if embeddings_only else config.embedding_model
        if name:
            # --precision is the served model's; an embedding model beside an LLM runs at its default.
            out.embedding = self._embedding_loader(name, config.precision if embeddings_only else None)
            if config.warmup:
                out.embedding.embed([WARMUP_PROMPT])
        return out

    # ---- stop ----

    async def drain_and_stop(self) -> int:
        """Readiness 503 now; let in-flight requests finish within the drain timeout; close. Exit code."""
        self.lifecycle.begin_drain()
        if self.ctx.num_in_flight == 0:
            self.ctx.idle.set()
        try:
            await asyncio.wait_for(self.ctx.idle.wait(), self.config.drain_timeout_s)
        except TimeoutError:
            log.warning("drain timeout (%.1f s): %d requests cut short", self.config.drain_timeout_s,
                        self.ctx.num_in_flight)
        await self.close()
        return 1 if self.load_error is not None else 0

    async def close(self) -> None:
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.async_engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.async_engine.stop)
        if self.ctx.embeddings is not None:
            await self.ctx.embeddings.close()
        self._stopped.set()

    def _on_signal(self) -> None:
        # Readiness must turn 503 at once, before anything else is scheduled.
        self.lifecycle.begin_drain()
        self._stopped.set()

    async def run_until_signal(self) -> int:
        """The CLI's whole life: start, serve until SIGTERM/SIGINT (or a failed load), drain, exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        await self.start()
        await self._stopped.wait()
        if self.load_error is not None:
            await self.close()
            return 1
        log.info("signal received: draining (up to %.1f s)", self.config.drain_timeout_s)
        code = await self.drain_and_stop()
        log.info("drained; exiting with %d", code)
        return code
