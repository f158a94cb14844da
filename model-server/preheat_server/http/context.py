"""What every handler can reach: settings, metrics, the lifecycle state and the loaded services."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from preheat_server.config import ServerConfig
from preheat_server.http.errors import APIError
from preheat_server.lifecycle import Lifecycle
from preheat_server.metrics import ServerMetrics

if TYPE_CHECKING:
    from preheat_server.embeddings.service import EmbeddingService
    from preheat_server.generation.service import GenerationService


@dataclass
class ServerContext:
    config: ServerConfig
    metrics: ServerMetrics
    lifecycle: Lifecycle
    served_model_name: str
    generation: GenerationService | None = None
    embeddings: EmbeddingService | None = None
    created: int = field(default=0)
    # Inference requests inside a handler (including streams still being written): what a drain waits for.
    num_in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def request_started(self) -> None:
        self.num_in_flight += 1
        self.idle.clear()

    def request_finished(self) -> None:
        self.num_in_flight -= 1
        if self.num_in_flight == 0:
            self.idle.set()

    def require_serving(self) -> None:
        """503 unless the server is ready: loading has not finished, or draining has begun."""
        state = self.lifecycle.state
        if state == "loading":
            raise APIError(503, "The model is still loading; retry shortly.", type="service_unavailable",
                           code="model_loading", headers={"Retry-After": "1"})
        if state == "draining":
            raise APIError(503, "The server is shutting down and takes no new requests; retry on another "
                           "replica.", type="service_unavailable", code="server_draining")

    def require_generation(self, model: str | None) -> GenerationService:
        self.require_serving()
        if self.generation is None:
            raise APIError(400, f"The model '{self.served_model_name}' serves embeddings only; it has no "
                           "completions.", param="model", code="model_not_supported")
        self.check_model(model, self.served_model_name)
        return self.generation

    def require_embeddings(self, model: str | None) -> EmbeddingService:
        self.require_serving()
        if self.embeddings is None:
            raise APIError(400, "This server has no embedding model (start it with --embedding-model).",
                           param="model", code="model_not_supported")
        self.check_model(model, self.embeddings.name)
        return self.embeddings

    @staticmethod
    def check_model(asked: str | None, served: str) -> None:
        if asked is not None and asked != served:
            raise APIError(404, f"The model '{asked}' does not exist; this server serves '{served}'.",
                           param="model", code="model_not_found")


CONTEXT: web.AppKey[ServerContext] = web.AppKey("preheat_context", ServerContext)
