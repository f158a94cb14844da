"""Request-level dynamic batching for embeddings: many small requests share one forward pass.

Inputs from concurrent requests queue up; a batch closes when it holds `max_batch_size` inputs or
when its oldest input has waited `max_queue_delay_ms`, whichever comes first. While one batch runs
(in a dedicated thread, so the event loop keeps serving), the next one fills, so under load batches
are full and the delay is never paid; at low load an input waits at most the delay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch


@dataclass
class _Item:
    ids: list[int]
    future: asyncio.Future
    enqueued: float = field(default=0.0)


class EmbeddingBatcher:
    """Owns the queue and the worker task; `await embed(token_id_lists)` returns one vector per input."""

    def __init__(self, embed_ids: Callable[[list[list[int]]], torch.Tensor], max_batch_size: int,
                 max_queue_delay_ms: float,
                 on_batch: Callable[[int, list[float]], None] | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError("embedding max batch size must be >= 1")
        if max_queue_delay_ms < 0:
            raise ValueError("embedding max queue delay must be >= 0")
        self._embed_ids = embed_ids
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay_ms / 1000.0
        self._on_batch = on_batch
        self._pending: deque[_Item] = deque()
        self._wakeup = asyncio.Event()
        # One thread: torch already uses every core for one batch; two batches at once would only fight.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="embedding-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(RuntimeError("embedding batcher stopped"))
        self._pending.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def embed(self, inputs: list[list[int]]) -> list[torch.Tensor]:
        loop = asyncio.get_running_loop()
        items = [_Item(ids, loop.create_future(), loop.time()) for ids in inputs]
        self._pending.extend(items)
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*(i.future for i in items)))
        except asyncio.CancelledError:
            for i in items:   # the client went away: drop its inputs that have not run yet
                i.future.cancel()
            raise

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = self._pending[0].enqueued + self.max_queue_delay
            while len(self._pending) < self.max_batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            batch: list[_Item] = []
            while self._pending and len(batch) < self.max_batch_size:
                item = self._pending.popleft()
                if not item.future.done():
                    batch.append(item)
            if not batch:
                continue
            started = loop.time()
            try:
                vectors = await loop.run_in_executor(self._executor, self._embed_ids, [i.ids for i in batch])
            except Exception as exc:   # a failed forward pass fails its requests, not the server
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            for row, item in enumerate(batch):
                if not item.future.done():
                    item.future.set_result(vectors[row])
            if self._on_batch is not None:
                self._on_batch(len(batch), [started - i.enqueued for i in batch])
