"""One request as the engine tracks it: its tokens, how many have KV in the cache, and its KV blocks."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer ≥ 1, got {self.max_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer ≥ 0, got {self.top_k!r}")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens = prompt + output. ``num_computed_tokens`` of them have K/V in ``block_table``'s blocks."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival: int):
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.arrival = arrival  # monotonically increasing admission order
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        # Prompt tokens whose KV came from the prefix cache at the first admission.
        self.num_cached_tokens = 0
        self.first_scheduled = False
        self.block_table: list[int] = []
        # Chain hashes of the full blocks already registered in the prefix cache.
        self.block_hashes: list[int] = []
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.generator: torch.Generator | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
