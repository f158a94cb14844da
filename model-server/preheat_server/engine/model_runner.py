"""Runs one scheduled step on the model: owns the KV cache tensors, builds the step's inputs, samples."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..models.loader import LoadedModel
from ..sampling import TokenLogprob
from .attention import DecodeGroup, PagedAttention, PrefillBatch, decode_groups
from .sampler import sample, token_logprobs
from .sequence import Sequence


@dataclass
class StepOutput:
    """What one step computed: sampled tokens (sequences whose chunk reached their end) and, where
    asked, their log-probabilities and those of the prompt tokens in this step's chunks."""

    tokens: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int):
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.block_size = block_size
        cfg = loaded.config
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=loaded.dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.v_caches = [torch.zeros(shape, dtype=loaded.dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_caches + self.v_caches)

    def _tensor(self, data: list[int]) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def execute(self, batch: list[tuple[Sequence, int]]) -> StepOutput:
        """Compute ``n`` new tokens of each (seq, n); sample for sequences whose chunk reached the end
        of their tokens."""
        bs = self.block_size
        # Single-token steps first, longest context first: they form the batched decode groups.
        batch = sorted(batch, key=lambda x: (x[1] > 1, -x[0].num_computed_tokens if x[1] == 1 else 0))
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        samplers: list[Sequence] = []
        decode_tables: list[list[int]] = []
        decode_ctx: list[int] = []
        # Prefill chunks as (first flat row, chunk length, context length, context slots).
        prefills: list[tuple[int, int, int, list[int]]] = []
        # Prompt positions whose next-token log-probability is asked: (seq, first flat row, first pos, count).
        scored: list[tuple[Sequence, int, int, int]] = []
        for seq, n in batch:
            c = seq.num_computed_tokens
            start = len(ids)
            ctx = c + n
            ids.extend(seq.token_ids[c:ctx])
            pos.extend(range(c, ctx))
            table = seq.block_table
            if n == 1:
                slots.append(table[c // bs] * bs + c % bs)
                decode_tables.append(table[: -(-ctx // bs)])
                decode_ctx.append(ctx)
            else:
                ctx_slots = [table[i // bs] * bs + i % bs for i in range(ctx)]
                slots.extend(ctx_slots[c:])
                prefills.append((start, n, ctx, ctx_slots))
            if ctx == seq.num_tokens:
                logit_rows.append(start + n - 1)
                samplers.append(seq)
            if seq.params.prompt_logprobs is not None:
                # Position p predicts prompt token p + 1; those already scored (before a preemption) are skipped.
                first = max(c, len(seq.prompt_logprobs))
                last = min(ctx, seq.num_prompt_tokens - 1)
                if last > first:
                    scored.append((seq, start + first - c, first, last - first))
        b = len(decode_tables)
        groups = [self._decode_group(start, decode_tables[start : start + n], decode_ctx[start : start + n])
                  for start, n in decode_groups([len(t) for t in decode_tables])]
        prefill = self._prefill_batch(prefills) if prefills else None
        backend = PagedAttention(self.k_caches, self.v_caches, self._tensor(slots), b, groups, prefill)
        hidden = self.model.hidden_states(self._tensor(ids), self._tensor(pos), backend)
        out = StepOutput()
        for seq, row, first, count in scored:
            lp = torch.log_softmax(self.model.compute_logits(hidden[row : row + count]), dim=-1)
            targets = seq.token_ids[first + 1 : first + 1 + count]
            out.prompt_logprobs[seq.request_id] = token_logprobs(lp, targets, seq.params.prompt_logprobs)
        if not samplers:
            return out
        logits = self.model.compute_logits(hidden[self._tensor(logit_rows)])
        tokens = sample(logits, samplers)
        out.tokens = {s.request_id: t for s, t in zip(samplers, tokens, strict=True)}
        wanted = [i for i, s in enumerate(samplers) if s.params.logprobs is not None]
        for i in wanted:
            seq = samplers[i]
            lp = torch.log_softmax(logits[i : i + 1], dim=-1)
            out.logprobs[seq.request_id] = token_logprobs(lp, [tokens[i]], seq.params.logprobs)[0]
        return out

    def _decode_group(self, start: int, tables: list[list[int]], ctx: list[int]) -> DecodeGroup:
        """Block tables padded to the group's longest, and the mask of each row's real keys."""
        n, maxb = len(tables), max(len(t) for t in tables)
        bt = self._tensor([t + [0] * (maxb - len(t)) for t in tables]).view(n, maxb)
        k_idx = torch.arange(maxb * self.block_size, device=self.device)
        mask = (k_idx[None, :] < self._tensor(ctx)[:, None]).view(n, 1, 1, maxb * self.block_size)
        return DecodeGroup(start, n, bt, mask)

    def _prefill_batch(self, prefills: list[tuple[int, int, int, list[int]]]) -> PrefillBatch:
        """Pads every prefill chunk of the step to one [P, max_len] x [P, max_ctx] attention problem."""
        max_len = max(n for _, n, _, _ in prefills)
        max_ctx = max(ctx for _, _, ctx, _ in prefills)
        q_rows = [[start + i for i in range(n)] + [0] * (max_len - n) for start, n, _, _ in prefills]
        kv_slots = [s + [0] * (max_ctx - len(s)) for _, _, _, s in prefills]
        lens = self._tensor([n for _, n, _, _ in prefills])
        ctxs = self._tensor([ctx for _, _, ctx, _ in prefills])
        i = torch.arange(max_len, device=self.device)
        j = torch.arange(max_ctx, device=self.device)
        # Token i of a chunk sits at position ctx - n + i and sees keys j <= that position.
        q_pos = (ctxs - lens)[:, None] + i[None, :]  # [P, max_len]
        real = i[None, :] < lens[:, None]
        mask = (j[None, None, :] <= q_pos[:, :, None]) & real[:, :, None]
        mask[:, :, 0] |= ~real  # padding rows see key 0 so no row is fully masked
        g = self.loaded.config.num_attention_heads // self.loaded.config.num_key_value_heads
        mask = mask.repeat(1, g, 1).unsqueeze(1)  # rows ordered (group head, token) like the queries
        valid = real.reshape(-1).nonzero().squeeze(1)
        dest = self._tensor([start + k for start, n, _, _ in prefills for k in range(n)])
        return PrefillBatch(self._tensor(q_rows), self._tensor(kv_slots), mask, valid, dest)
