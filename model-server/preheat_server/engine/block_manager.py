"""Which KV block holds which tokens: a free list, per-sequence block tables and the prefix cache.

Prefix caching: a full block is identified by a hash chain over the token ids of it and every block
before it. Blocks whose reference count falls to 0 stay in the free list with their hash, in LRU
order, so a later request with the same prefix can take them back; a block is evicted (its hash
forgotten) only when the free list hands it out for new tokens.
"""

from __future__ import annotations

from collections import OrderedDict

from .sequence import Sequence


class Block:
    __slots__ = ("block_hash", "block_id", "ref_count", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def chain_hash(prev: int | None, token_ids: tuple[int, ...]) -> int:
    # Python's hash of a tuple of ints is deterministic across runs (no hash randomisation for ints).
    return hash((prev if prev is not None else -1, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be ≥ 1")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in LRU order (front = evicted first). Cached ones keep their hash until reused.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_cache_queries = 0  # tokens looked up, cumulative
        self.prefix_cache_hits = 0  # tokens found, cumulative

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        b = self.blocks[block_id]
        if b.block_hash is not None:  # evict: this block's cached content is overwritten now
            if self.hash_to_block.get(b.block_hash) == block_id:
                del self.hash_to_block[b.block_hash]
            b.block_hash, b.token_ids = None, ()
        b.ref_count = 1
        return block_id

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of ``seq`` (full blocks only; not yet referenced).

        At least one token is always left to compute, so a fully cached prompt still runs the model
        to produce its first output token: the last block is not taken from the cache then.
        """
        # Prompt log-probabilities need the model to see every prompt token, cached or not.
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits: list[int] = []
        prev: int | None = None
        for i in range(max_blocks):
            toks = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(prev, toks)
            bid = self.hash_to_block.get(h)
            if bid is None or self.blocks[bid].token_ids != toks:
                break
            hits.append(bid)
            prev = h
        return hits

    def can_admit(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> bool:
        """Whether blocks for the cached prefix plus ``num_new_tokens`` more can be had now."""
        need = self.blocks_needed(len(cached) * self.block_size + num_new_tokens) - len(cached)
        # Cached blocks sitting in the free list are taken out of it, not allocated.
        reclaimed = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        return self.num_free_blocks - reclaimed >= need

    def admit(self, seq: Sequence, cached: list[int]) -> None:
        """Attach the cached prefix blocks to a sequence that holds no blocks yet."""
        assert not seq.block_table
        bs = self.block_size
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += len(cached) * bs
        prev: int | None = None
        for bid in cached:
            b = self.blocks[bid]
            if b.ref_count == 0:
                del self.free[bid]
            b.ref_count += 1
            seq.block_table.append(bid)
            prev = b.block_hash
            seq.block_hashes.append(prev)  # type: ignore[arg-type]
        seq.num_computed_tokens = len(cached) * bs

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return self.num_free_blocks >= need

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq``'s block table to hold ``num_new_tokens`` more tokens."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            raise RuntimeError("append without can_append: out of KV blocks")
        for _ in range(need):
            seq.block_table.append(self._take_free())

    def register_full_blocks(self, seq: Sequence) -> None:
        """Enter ``seq``'s newly completed blocks into the prefix cache (call after KV is written)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        for i in range(len(seq.block_hashes), full):
            toks = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            prev = seq.block_hashes[-1] if seq.block_hashes else None
            h = chain_hash(prev, toks)
            seq.block_hashes.append(h)
            b = self.blocks[seq.block_table[i]]
            # A concurrent identical prefix may already be registered: keep the first, skip this one.
            if h not in self.hash_to_block:
                b.block_hash, b.token_ids = h, toks
                self.hash_to_block[h] = b.block_id

    def free_sequence(self, seq: Sequence) -> None:
        """Drop ``seq``'s references. Tail blocks go to the front of the LRU (evicted first)."""
        for bid in reversed(seq.block_table):
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count == 0:
                self.free[bid] = None
                if b.block_hash is None:
                    self.free.move_to_end(bid, last=False)  # nothing cached in it: reuse first
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def check_invariants(self) -> None:
        """Every block is either free with ref 0 or referenced; used by tests to find leaks."""
        for b in self.blocks:
            in_free = b.block_id in self.free
            if in_free != (b.ref_count == 0) or b.ref_count < 0:
                raise AssertionError(f"block {b.block_id}: ref_count={b.ref_count}, in free list={in_free}")
