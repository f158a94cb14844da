"""Attention over the paged KV cache: write this step's K/V into its slots, read context through block tables.

Single-token decodes are batched: their blocks are gathered into a padded [B, L] view and one masked
SDPA call serves them all. Prefill chunks (more than one query token) attend one sequence at a time
to their cached context plus themselves, causally. Grouped-query attention is computed without
copying K/V per query head: the query heads of a KV group are stacked along the query axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start: int  # offset of the chunk's first token in this step's flat token list
    length: int  # query tokens
    context_len: int  # keys it attends to (cached + this chunk)
    block_table: torch.Tensor  # [ceil(context_len / block_size)] block ids
    mask: torch.Tensor  # [length, context_len] bool, True = may attend


class PagedAttention:
    """Per-step attention metadata plus the cache tensors; the model calls ``attend`` per layer."""

    def __init__(
        self,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        slot_mapping: torch.Tensor,
        num_decodes: int,
        decode_block_tables: torch.Tensor | None,
        decode_mask: torch.Tensor | None,
        prefills: list[PrefillChunk],
    ):
        self.k_caches, self.v_caches = k_caches, v_caches
        self.slot_mapping = slot_mapping
        self.num_decodes = num_decodes
        self.decode_block_tables = decode_block_tables  # [B, max_blocks]
        self.decode_mask = decode_mask  # [B, 1, 1, max_blocks * block_size]
        self.prefills = prefills

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k_caches[layer_idx], self.v_caches[layer_idx]  # [num_blocks, bs, Hkv, D]
        nb, bs, hkv, d = kc.shape
        h = q.shape[1]
        g = h // hkv
        kc.view(nb * bs, hkv, d).index_copy_(0, self.slot_mapping, k.to(kc.dtype))
        vc.view(nb * bs, hkv, d).index_copy_(0, self.slot_mapping, v.to(vc.dtype))
        out = torch.empty_like(q)
        b = self.num_decodes
        if b:
            bt = self.decode_block_tables
            kg = kc[bt].view(b, -1, hkv, d).transpose(1, 2)  # [B, Hkv, L, D]
            vg = vc[bt].view(b, -1, hkv, d).transpose(1, 2)
            qd = q[:b].view(b, hkv, g, d)  # query heads of one KV group side by side
            o = F.scaled_dot_product_attention(qd, kg, vg, attn_mask=self.decode_mask)
            out[:b] = o.reshape(b, h, d)
        for p in self.prefills:
            n, ctx = p.length, p.context_len
            kg = kc[p.block_table].view(-1, hkv, d)[:ctx].transpose(0, 1)  # [Hkv, ctx, D]
            vg = vc[p.block_table].view(-1, hkv, d)[:ctx].transpose(0, 1)
            qp = q[p.start : p.start + n].view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
            mask = p.mask.repeat(g, 1)  # rows ordered (group head, token) like qp
            o = F.scaled_dot_product_attention(qp, kg, vg, attn_mask=mask)
            out[p.start : p.start + n] = o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, h, d)
        return out
