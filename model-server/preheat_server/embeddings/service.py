"""Texts in, unit vectors out: tokenizes, checks lengths, admits against the queue bound, batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from preheat_server.embeddings.batcher import EmbeddingBatcher
from preheat_server.embeddings.model import EmbeddingModel
from preheat_server.generation.async_engine import QueueFullError
from preheat_server.generation.service import InvalidRequestError
from preheat_server.metrics import ServerMetrics


@dataclass
class EmbeddingResult:
    vectors: list[torch.Tensor]
    num_tokens: int


class EmbeddingService:
    """One embedding model behind a dynamic batcher; `max_in_flight` requests at most, then 429."""

    def __init__(self, model: EmbeddingModel, metrics: ServerMetrics, max_batch_size: int,
                 max_queue_delay_ms: float, max_queue: int) -> None:
        self.model = model
        self.name = model.name
        self.dimension = model.dimension
        self.metrics = metrics
        self.max_in_flight = max_batch_size + max_queue
        self.num_in_flight = 0
        # Children bound once: labels() per observation costs more than the observation itself.
        self._batch_size = metrics.embedding_batch_size.labels(self.name)
        self._queue_delay = metrics.embedding_queue_delay.labels(self.name)
        self._inputs = metrics.embedding_inputs.labels(self.name)
        self._tokens = metrics.embedding_tokens.labels(self.name)
        self.batcher = EmbeddingBatcher(model.embed_ids, max_batch_size, max_queue_delay_ms, self._observe_batch)

    def start(self) -> None:
        self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close()

    def _observe_batch(self, size: int, waits: list[float]) -> None:
        self._batch_size.observe(size)
        for w in waits:
            self._queue_delay.observe(w)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text; an input longer than the model's window is a 400, never silently cut."""
        ids = self.model.tokenize(texts)
        for i, seq in enumerate(ids):
            if len(seq) > self.model.max_seq_length:
                raise InvalidRequestError(
                    f"Input {i} has {len(seq)} tokens; the embedding model '{self.name}' takes at most "
                    f"{self.model.max_seq_length}. Split the text.", param="input", code="context_length_exceeded")
        return ids

    async def embed(self, ids: list[list[int]]) -> EmbeddingResult:
        if self.num_in_flight >= self.max_in_flight:
            raise QueueFullError(f"{self.num_in_flight} embedding requests in flight; at most "
                                 f"{self.max_in_flight} are admitted")
        self.num_in_flight += 1
        try:
            vectors = await self.batcher.embed(ids)
        finally:
            self.num_in_flight -= 1
        n_tokens = sum(len(s) for s in ids)
        self._inputs.inc(len(ids))
        self._tokens.inc(n_tokens)
        return EmbeddingResult(vectors, n_tokens)
