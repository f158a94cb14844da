"""The engine the HTTP layer drives: add requests, call ``step()`` in a loop, read outputs and stats.

Single-threaded by design: one dedicated thread owns the engine and calls every method.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from ..models.loader import LoadedModel
from ..sampling import TokenLogprob
from .block_manager import BlockManager
from .model_runner import ModelRunner, available_memory_bytes
from .scheduler import ItlController, Scheduler
from .sequence import SamplingParams, Sequence, SequenceStatus


@dataclass
class EngineConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None  # explicit KV cache size; wins over the memory fraction
    kv_cache_memory_fraction: float | None = None  # of available memory (CUDA free / MemAvailable)
    enable_prefix_caching: bool = True
    target_itl_ms: float | None = None
    # A floor on each busy step's duration: the engine sleeps out the rest. It emulates an accelerator's
    # decode step on a host whose replicas share a few cores (the lab's closed loop), so a replica's
    # capacity is its own and adding replicas adds capacity, as it does with one GPU per replica.
    min_step_ms: float = 0.0

    def validate(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be ≥ 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be ≥ 1")
        if self.block_size < 1:
            raise ValueError("block_size must be ≥ 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be ≥ 1")
        if self.kv_cache_memory_fraction is not None and not 0.0 < self.kv_cache_memory_fraction <= 0.95:
            raise ValueError("kv_cache_memory_fraction must be in (0, 0.95]")
        if self.target_itl_ms is not None and self.target_itl_ms <= 0:
            raise ValueError("target_itl_ms must be > 0")
        if self.min_step_ms < 0:
            raise ValueError("min_step_ms must be >= 0")


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    # Where asked (SamplingParams.logprobs / prompt_logprobs): one per new token; the prompt's once,
    # with the first output, for prompt tokens 1.. (token 0 has nothing before it).
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1, blocks referenced by sequences
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_queries: int  # tokens, cumulative
    prefix_cache_hits: int  # tokens, cumulative
    num_preemptions: int  # cumulative
    last_batch_size: int
    last_batch_tokens: int
    # Extensions beyond the first contract (additive):
    max_running_cap: int = 0  # current cap from the inter-token-latency controller
    num_prompt_tokens_total: int = 0  # prompt tokens of all accepted requests
    num_generation_tokens_total: int = 0
    last_step_seconds: float = 0.0
    kv_cache_bytes: int = 0


# Defaults when neither num_kv_blocks nor a memory fraction is given: enough blocks for every running
# sequence at full context, but never more than this share of available memory.
_DEFAULT_KV_FRACTION_CAP = 0.10


class LLMEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None):
        self.loaded = loaded
        self.config = config = config or EngineConfig()
        config.validate()
        mcfg = loaded.config
        self.max_model_len = mcfg.max_position_embeddings
        bs = config.block_size
        per_block = mcfg.kv_bytes_per_token(loaded.dtype) * bs
        if config.num_kv_blocks is not None:
            num_blocks = config.num_kv_blocks
        elif config.kv_cache_memory_fraction is not None:
            num_blocks = int(available_memory_bytes(loaded.device) * config.kv_cache_memory_fraction) // per_block
        else:
            want = config.max_num_seqs * -(-self.max_model_len // bs)
            cap = int(available_memory_bytes(loaded.device) * _DEFAULT_KV_FRACTION_CAP) // per_block
            num_blocks = max(min(want, cap), -(-self.max_model_len // bs))
        if num_blocks < 1:
            raise ValueError("the KV cache budget is smaller than one block")
        self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching)
        self.runner = ModelRunner(loaded, num_blocks, bs)
        self.itl = ItlController(config.target_itl_ms, config.max_num_seqs)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, self.itl)
        self.seqs: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._pending: list[RequestOutput] = []  # aborts to report on the next step
        self._last_batch_size = 0
        self._last_batch_tokens = 0
        self._last_step_seconds = 0.0
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0

    # ---- requests -------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None) -> None:
        """Queue a request; ValueError (with the reason) when it cannot be served."""
        params = params or SamplingParams()
        params.validate()
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        ids = list(prompt_token_ids)
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        vocab = self.loaded.config.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids must be integers in [0, {vocab}); got {bad[:3]}")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; the model's context is {self.max_model_len} "
                "and at least one must be left to generate"
            )
        if self.block_manager.blocks_needed(len(ids) + 1) > self.block_manager.num_blocks:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but the KV cache holds only "
                f"{self.block_manager.num_blocks * self.block_manager.block_size}"
            )
        seq = Sequence(request_id, ids, params, next(self._arrivals))
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        self._prompt_tokens_total += len(ids)

    def abort_request(self, request_id: str) -> None:
        """Cancel a request: its KV blocks are freed now; the next step() reports finish_reason="abort".

        Unknown or already finished ids are ignored (a client may disconnect after the end).
        """
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "abort"
        self._pending.append(self._output(seq, []))

    def has_unfinished_requests(self) -> bool:
        return bool(self.seqs) or bool(self._pending)

    # ---- the loop -------------------------------------------------------------------------------

    def _output(self, seq: Sequence, new: list[int]) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_output_tokens=seq.num_output_tokens,
        )

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        del self.seqs[seq.request_id]

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if not p.ignore_eos and token in self.loaded.config.eos_token_ids:
            return "stop"
        if token in p.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run the model once over every scheduled token, sample, retire."""
        outputs, self._pending = self._pending, []
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        for seq in sched.out_of_kv:
            self._finish(seq, "length")
            outputs.append(self._output(seq, []))
        if not sched.batch:
            self._last_batch_size = self._last_batch_tokens = 0
            return outputs
        step = self.runner.execute(sched.batch)
        for seq, n in sched.batch:
            seq.num_computed_tokens += n
            self.block_manager.register_full_blocks(seq)
            seq.prompt_logprobs.extend(step.prompt_logprobs.get(seq.request_id, ()))
            token = step.tokens.get(seq.request_id)
            if token is None:
                continue  # a prefill chunk that has not reached the end of the prompt yet
            first = seq.num_output_tokens == 0
            seq.token_ids.append(token)
            self._generation_tokens_total += 1
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason)
            out = self._output(seq, [token])
            if seq.request_id in step.logprobs:
                out.logprobs = [step.logprobs[seq.request_id]]
            if first and seq.params.prompt_logprobs is not None:
                out.prompt_logprobs = list(seq.prompt_logprobs)
            outputs.append(out)
        if self.loaded.device.type == "cuda":
            torch.cuda.synchronize(self.loaded.device)
        self._pace(t0)
        dt = time.perf_counter() - t0
        self._last_batch_size = len(sched.batch)
        self._last_batch_tokens = sched.num_tokens
        self._last_step_seconds = dt
        self.itl.observe(dt, len(sched.batch))
        return outputs

    def _pace(self, t0: float) -> None:
        """Sleep out the rest of min_step_ms (the engine thread only; the event loop keeps serving)."""
        rest = self.config.min_step_ms / 1000 - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=bm.usage,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            last_batch_size=self._last_batch_size,
            last_batch_tokens=self._last_batch_tokens,
            max_running_cap=min(self.config.max_num_seqs, self.itl.cap),
            num_prompt_tokens_total=self._prompt_tokens_total,
            num_generation_tokens_total=self._generation_tokens_total,
            last_step_seconds=self._last_step_seconds,
            kv_cache_bytes=self.runner.kv_cache_bytes,
        )

    # ---- helpers for tests and benchmarks -------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[list[int]]:
        """Run ``prompts`` concurrently to completion; output token ids in prompt order."""
        base = f"gen-{next(self._arrivals)}-"
        rids = [f"{base}{i}" for i in range(len(prompts))]
        results: dict[str, list[int]] = {r: [] for r in rids}
        for r, p in zip(rids, prompts, strict=True):
            self.add_request(r, p, params)
        pending = set(rids)
        while pending:
            for out in self.step():
                if out.request_id in results:
                    results[out.request_id].extend(out.new_token_ids)
                    if out.finished:
                        pending.discard(out.request_id)
        return [results[r] for r in rids]
