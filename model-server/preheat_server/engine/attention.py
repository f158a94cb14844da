"""Attention over the paged KV cache: write this step's K/V into its slots, read context through block tables.

Single-token decodes are batched: their blocks are gathered into a padded [B, L] view and one masked
SDPA call serves a group of them. Decodes are grouped by context length (longest first, see
``decode_groups``) so one long conversation does not make every short one gather and attend over its
length: padding to the longest context of the whole batch cost more than the weights' GEMMs at c=32
on mixed-length traffic. Prefill chunks (more than one query token) are batched the same way: their
query rows and context slots are padded to [P, max chunk] / [P, max context] and one masked SDPA call
serves every chunk of the step, causally. All index tensors and masks are built once per step (by the
model runner), not once per layer. Grouped-query attention is computed without copying K/V per query
head: the query heads of a KV group are stacked along the query axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DecodeGroup:
    """Consecutive decode rows ``start .. start + count`` whose blocks are gathered together."""

    start: int
    count: int
    block_tables: torch.Tensor  # [count, max_blocks] of this group (pad: block 0)
    mask: torch.Tensor  # [count, 1, 1, max_blocks * block_size] bool: key slot < context length


def decode_groups(num_blocks: list[int], max_groups: int = 4) -> list[tuple[int, int]]:
    """Split decodes sorted by context length (blocks, longest first) into (start, count) runs.

    A new group starts when a sequence needs at most half the blocks of its group's longest, so each
    gather pads less than half of its rows; at most ``max_groups`` groups (each one is an extra
    index_select + SDPA per layer)."""
    groups: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(num_blocks) + 1):
        if i == len(num_blocks) or (2 * num_blocks[i] <= num_blocks[start] and len(groups) < max_groups - 1):
            groups.append((start, i - start))
            start = i
    return groups


@dataclass
class PrefillBatch:
    """Every prefill chunk of a step, padded to the longest chunk and the longest context.

    Padding query rows attend to key 0 only (a fully masked row would give NaN) and are dropped.
    """

    q_rows: torch.Tensor  # [P, max_len] row of each chunk token in the step's flat token list (pad: 0)
    kv_slots: torch.Tensor  # [P, max_ctx] cache slot of each context token (pad: 0)
    mask: torch.Tensor  # [P, 1, g * max_len, max_ctx] bool, rows ordered (group head, token)
    valid: torch.Tensor  # indices into the flattened [P * max_len] rows that are real tokens
    dest: torch.Tensor  # their rows in the step's flat output


class PagedAttention:
    """Per-step attention metadata plus the cache tensors; the model calls ``attend`` per layer."""

    def __init__(
        self,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        slot_mapping: torch.Tensor,
        num_decodes: int,
        decode_groups: list[DecodeGroup],
        prefill: PrefillBatch | None,
    ):
        self.k_caches, self.v_caches = k_caches, v_caches
        self.slot_mapping = slot_mapping
        self.num_decodes = num_decodes  # the first rows of the step; covered by decode_groups in order
        self.decode_groups = decode_groups
        self.prefill = prefill

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k_caches[layer_idx], self.v_caches[layer_idx]  # [num_blocks, bs, Hkv, D]
        nb, bs, hkv, d = kc.shape
        h = q.shape[1]
        g = h // hkv
        k_flat, v_flat = kc.view(nb * bs, hkv, d), vc.view(nb * bs, hkv, d)
        k_flat.index_copy_(0, self.slot_mapping, k.to(kc.dtype))
        v_flat.index_copy_(0, self.slot_mapping, v.to(vc.dtype))
        b = self.num_decodes
        p = self.prefill
        if b and p is None and b == q.shape[0] and len(self.decode_groups) == 1:
            out = None  # decode-only step in one group: SDPA's output is the whole result
        else:
            out = torch.empty_like(q)
        for grp in self.decode_groups:
            n = grp.count
            # index_select copies whole blocks (memcpy per block); kc[bt] took ~4x longer on CPU.
            flat_bt = grp.block_tables.view(-1)
            kg = kc.index_select(0, flat_bt).view(n, -1, hkv, d).transpose(1, 2)  # [n, Hkv, L, D]
            vg = vc.index_select(0, flat_bt).view(n, -1, hkv, d).transpose(1, 2)
            qd = q[grp.start : grp.start + n].view(n, hkv, g, d)  # query heads of one KV group side by side
            o = F.scaled_dot_product_attention(qd, kg, vg, attn_mask=grp.mask).reshape(n, h, d)
            if out is None:
                return o
            out[grp.start : grp.start + n] = o
        if p is not None:
            n_p, max_len = p.q_rows.shape
            max_ctx = p.kv_slots.shape[1]
            flat_slots = p.kv_slots.view(-1)
            kg = k_flat.index_select(0, flat_slots).view(n_p, max_ctx, hkv, d).transpose(1, 2)  # [P, Hkv, ctx, D]
            vg = v_flat.index_select(0, flat_slots).view(n_p, max_ctx, hkv, d).transpose(1, 2)
            qp = q.index_select(0, p.q_rows.view(-1)).view(n_p, max_len, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n_p, hkv, g * max_len, d)
            o = F.scaled_dot_product_attention(qp, kg, vg, attn_mask=p.mask)
            o = o.view(n_p, hkv, g, max_len, d).permute(0, 3, 1, 2, 4).reshape(n_p * max_len, h, d)
            out[p.dest] = o[p.valid]
        return out
