"""The server's settings (one field per command-line flag), validated once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class ServerConfig:
    model: str = "tiny"
    host: str = ""                      # "" means $POD_IP, else 127.0.0.1
    port: int = 8000
    device: str = "auto"
    precision: str | None = None        # None: fp32 on CPU, bf16 on CUDA
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    kv_cache_blocks: int | None = None
    kv_cache_memory_fraction: float | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_queue: int = 64
    target_itl_ms: float | None = None
    min_step_ms: float = 0.0            # emulated accelerator step time (lab); 0: as fast as the host runs
    drain_timeout_s: float = 30.0
    served_model_name: str | None = None
    embedding_model: str | None = None
    embedding_max_batch_size: int = 32
    embedding_max_queue_delay_ms: float = 5.0
    completion_cache_size: int = 256
    warmup: bool = True
    api_key: str | None = None          # --api-key, else $PREHEAT_API_KEY (e.g. from a Secret); None: open

    def bind_host(self) -> str:
        return self.host or os.environ.get("POD_IP") or "127.0.0.1"

    def validate(self) -> None:
        """Raise ValueError naming the first flag with an impossible value."""
        checks = [
            (0 <= self.port <= 65535, "--port must be in 0..65535"),
            (self.max_num_seqs >= 1, "--max-num-seqs must be >= 1"),
            (self.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be >= 1"),
            (self.kv_cache_blocks is None or self.kv_cache_blocks >= 1, "--kv-cache-blocks must be >= 1"),
            (self.kv_cache_memory_fraction is None or 0 < self.kv_cache_memory_fraction <= 1,
             "--kv-cache-memory-fraction must be in (0, 1]"),
            (self.block_size >= 1, "--block-size must be >= 1"),
            (self.max_queue >= 0, "--max-queue must be >= 0"),
            (self.target_itl_ms is None or self.target_itl_ms > 0, "--target-itl-ms must be > 0"),
            (self.min_step_ms >= 0, "--min-step-ms must be >= 0"),
            (self.drain_timeout_s >= 0, "--drain-timeout-s must be >= 0"),
            (self.embedding_max_batch_size >= 1, "--embedding-max-batch-size must be >= 1"),
            (self.embedding_max_queue_delay_ms >= 0, "--embedding-max-queue-delay-ms must be >= 0"),
            (self.completion_cache_size >= 0, "--completion-cache-size must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        from preheat_server.embeddings.model import EMBEDDING_PRECISIONS, is_embedding_model

        if self.precision not in (None, *EMBEDDING_PRECISIONS) and is_embedding_model(self.model):
            raise ValueError(f"--precision {self.precision} does not apply to the embedding model {self.model}: "
                             f"use {' or '.join(EMBEDDING_PRECISIONS)}")
