"""Text in, text out: tokenizes prompts, checks them against the context, runs them on the engine,
applies stop strings and the completion cache. Knows nothing of HTTP or of OpenAI's JSON shapes.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from preheat_server.generation.async_engine import AsyncEngine
from preheat_server.generation.completion_cache import CachedGeneration, CacheKey, CompletionCache
from preheat_server.generation.text_stream import TextStream
from preheat_server.metrics import ServerMetrics
from preheat_server.sampling import SamplingParams, TokenLogprob

SAMPLING_EPS = 1e-5


class InvalidRequestError(ValueError):
    """The request cannot be served as asked (the HTTP layer answers 400 naming `param`)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request, ready for the engine."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    stop_token_ids: list[int]
    ignore_eos: bool
    logprobs: int | None = None         # each output token's log-probability, with this many alternatives
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (echo with logprobs)

    @property
    def cacheable(self) -> bool:
        # The cache keeps text, not log-probabilities.
        return self.temperature == 0.0 and self.logprobs is None and self.prompt_logprobs is None

    def cache_key(self) -> CacheKey:
        return CompletionCache.key(self.prompt_token_ids, self.max_tokens, self.stop, self.stop_token_ids,
                                   self.ignore_eos)


@dataclass
class Delta:
    """New text of one request; `finish_reason` is set on the last one."""

    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)   # of this delta's tokens, when asked
    prompt_logprobs: list[TokenLogprob] | None = None              # on the first delta, when asked


@dataclass(frozen=True)
class Generation:
    """A whole answer."""

    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str
    cached: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None


_ids = itertools.count()


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}{next(_ids):x}"


class GenerationService:
    """Everything between a parsed API request and engine token ids."""

    def __init__(self, loaded: Any, engine: AsyncEngine, cache: CompletionCache, metrics: ServerMetrics) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.engine = engine
        self.cache = cache
        self.metrics = metrics
        self.max_model_len = int(loaded.config.max_position_embeddings)
        self.vocab_size = int(loaded.config.vocab_size)

    # ---- prompts ----

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            bad = next((t for t in prompt if t >= self.vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(f"Token id {bad} is out of range: the vocabulary has {self.vocab_size} "
                                          "tokens.", param="prompt", code="invalid_token_id")
            ids = list(prompt)
        if not ids:
            raise InvalidRequestError("The prompt is empty after tokenization.", param="prompt")
        return ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode_prompt(self.tokenizer.apply_chat_template(messages))

    def build(self, prompt_token_ids: list[int], *, max_tokens: int | None, temperature: float | None,
              top_p: float | None, top_k: int | None, seed: int | None, stop: list[str], ignore_eos: bool,
              chat: bool, id_prefix: str, param: str, logprobs: int | None = None,
              prompt_logprobs: int | None = None) -> GenerationRequest:
        """Check the prompt against the context and fill defaults (no max_tokens: up to the context)."""
        n_prompt = len(prompt_token_ids)
        room = self.max_model_len - n_prompt
        if room < 1:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the prompt has "
                f"{n_prompt} tokens, leaving no room to generate.", param=param, code="context_length_exceeded")
        if max_tokens is None:
            max_tokens = room
        elif n_prompt + max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion). "
                "Reduce the prompt or max_tokens.", param="max_tokens", code="context_length_exceeded")
        # The engine always stops at the model's end-of-sequence ids (unless ignore_eos); a chat turn
        # also ends at the template's end-of-turn marker, which some models do not list as EOS.
        stop_ids = [int(t) for t in self.tokenizer.stop_token_ids] if chat and not ignore_eos else []
        temperature = 1.0 if temperature is None else float(temperature)
        top_p = 1.0 if top_p is None else float(top_p)
        # As vLLM does: a temperature this close to 0 would overflow logits / temperature, and a top_p
        # this small keeps only the most likely token; both mean greedy decoding.
        if temperature < SAMPLING_EPS or top_p < SAMPLING_EPS:
            temperature, top_p = 0.0, 1.0
        return GenerationRequest(
            request_id=new_request_id(id_prefix), prompt_token_ids=prompt_token_ids, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p,
            top_k=0 if top_k is None or top_k < 1 else int(top_k), seed=seed, stop=stop,
            stop_token_ids=stop_ids, ignore_eos=ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    def copies(self, req: GenerationRequest, n: int, id_prefix: str) -> list[GenerationRequest]:
        """``n`` independent requests for one prompt (n > 1); a seed gives each its own stream (seed + i)."""
        if n == 1:
            return [req]
        return [replace(req, request_id=new_request_id(id_prefix),
                        seed=None if req.seed is None else (req.seed + i) % 2**63) for i in range(n)]

    def _params(self, req: GenerationRequest) -> SamplingParams:
        return SamplingParams(
            max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
            seed=req.seed, stop_token_ids=tuple(req.stop_token_ids), ignore_eos=req.ignore_eos,
            logprobs=req.logprobs, prompt_logprobs=req.prompt_logprobs)

    # ---- running ----

    async def stream(self, req: GenerationRequest) -> AsyncIterator[Delta]:
        """Text deltas as tokens come out; whole UTF-8 characters only, stop strings cut and never sent."""
        text = TextStream(req.stop)
        n_prompt = len(req.prompt_token_ids)
        n_out = 0
        gen = self.engine.generate(req.request_id, req.prompt_token_ids, self._params(req))
        try:
            pending: list[TokenLogprob] = []          # log-probabilities not yet sent with a delta
            prompt_lp: list[TokenLogprob] | None = None
            async for out in gen:
                n_out = out.num_output_tokens
                pending += out.logprobs or []
                if out.prompt_logprobs is not None:
                    prompt_lp = out.prompt_logprobs
                piece = text.feed(self.tokenizer.decode_bytes(out.new_token_ids))
                finish = None
                if text.stopped:
                    # Found a stop string: end here, tell the engine to free the sequence now.
                    self.engine.mark_stopped(req.request_id)
                    finish = "stop"
                elif out.finished:
                    piece += text.finish()
                    finish = out.finish_reason if out.finish_reason in ("stop", "length") else "stop"
                if finish is not None or piece or pending:
                    yield Delta(piece, n_prompt, n_out, finish, pending, prompt_lp)
                    pending, prompt_lp = [], None
                if finish is not None:
                    return
        finally:
            await gen.aclose()

    async def complete(self, req: GenerationRequest) -> Generation:
        """The whole answer; greedy answers come from / go to the completion cache."""
        key = req.cache_key() if req.cacheable else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.metrics.completion_cache_hits.labels(self.metrics.model_name).inc()
                return Generation(hit.text, len(req.prompt_token_ids), hit.num_output_tokens, hit.finish_reason,
                                  cached=True)
        parts: list[str] = []
        logprobs: list[TokenLogprob] = []
        prompt_lp: list[TokenLogprob] | None = None
        last = Delta("", len(req.prompt_token_ids), 0, "stop")
        # aclosing: if the client goes away (this task is cancelled) the engine request is aborted now,
        # not whenever the abandoned generator is garbage-collected.
        async with aclosing(self.stream(req)) as deltas:
            async for delta in deltas:
                parts.append(delta.text)
                logprobs += delta.logprobs
                prompt_lp = delta.prompt_logprobs if delta.prompt_logprobs is not None else prompt_lp
                last = delta
        result = Generation("".join(parts), last.num_prompt_tokens, last.num_output_tokens,
                            last.finish_reason or "stop", logprobs=logprobs, prompt_logprobs=prompt_lp)
        if key is not None:
            self.cache.put(key, CachedGeneration(result.text, result.num_output_tokens, result.finish_reason))
        return result
