"""One request as the engine tracks it: its tokens, how many have KV in the cache, and its KV blocks."""

from __future__ import annotations

import enum

import torch

from ..sampling import SamplingParams


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
        # Log-probabilities of prompt tokens 1.. (token 0 has none), filled chunk by chunk when asked.
        self.prompt_logprobs: list = []

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
