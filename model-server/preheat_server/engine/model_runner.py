"""Runs one scheduled step on the model: owns the KV cache tensors, builds the step's inputs, samples."""

from __future__ import annotations

import os

import torch

from ..models.loader import LoadedModel
from .attention import PagedAttention, PrefillChunk
from .sampler import sample
from .sequence import Sequence


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
    def execute(self, batch: list[tuple[Sequence, int]]) -> dict[str, int]:
        """Compute ``n`` new tokens of each (seq, n); return {request_id: sampled token} for sequences
        whose chunk reached the end of their tokens."""
        bs = self.block_size
        # Single-token steps first: they form the batched decode group.
        batch = sorted(batch, key=lambda x: x[1] > 1)
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        samplers: list[Sequence] = []
        decode_tables: list[list[int]] = []
        decode_ctx: list[int] = []
        prefills: list[PrefillChunk] = []
        for seq, n in batch:
            c = seq.num_computed_tokens
            start = len(ids)
            ids.extend(seq.token_ids[c : c + n])
            positions = range(c, c + n)
            pos.extend(positions)
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in positions)
            ctx = c + n
            nblk = -(-ctx // bs)
            if n == 1:
                decode_tables.append(table[:nblk])
                decode_ctx.append(ctx)
            else:
                q_pos = torch.arange(c, ctx, device=self.device)
                k_pos = torch.arange(ctx, device=self.device)
                prefills.append(
                    PrefillChunk(start, n, ctx, self._tensor(table[:nblk]), k_pos[None, :] <= q_pos[:, None])
                )
            if ctx == seq.num_tokens:
                logit_rows.append(start + n - 1)
                samplers.append(seq)
        b = len(decode_tables)
        dec_bt = dec_mask = None
        if b:
            maxb = max(len(t) for t in decode_tables)
            dec_bt = self._tensor([t + [0] * (maxb - len(t)) for t in decode_tables]).view(b, maxb)
            k_idx = torch.arange(maxb * bs, device=self.device)
            dec_mask = (k_idx[None, :] < self._tensor(decode_ctx)[:, None]).view(b, 1, 1, maxb * bs)
        backend = PagedAttention(self.k_caches, self.v_caches, self._tensor(slots), b, dec_bt, dec_mask, prefills)
        hidden = self.model.hidden_states(self._tensor(ids), self._tensor(pos), backend)
        if not samplers:
            return {}
        logits = self.model.compute_logits(hidden[self._tensor(logit_rows)])
        tokens = sample(logits, samplers)
        return {s.request_id: t for s, t in zip(samplers, tokens, strict=True)}
