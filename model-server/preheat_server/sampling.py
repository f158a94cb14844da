"""How one request is sampled: the engine reads it, the generation service builds it (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20  # alternatives per token at most (OpenAI's limit)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model (before temperature/top-k/top-p), and the most
    likely alternatives at its position, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None         # None: none; k >= 0: each output token's, with k alternatives
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (the prefix cache is bypassed)

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer ≥ 1, got {self.max_tokens!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer ≥ 0, got {self.top_k!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in 0..{MAX_LOGPROBS}, got {value!r}")
