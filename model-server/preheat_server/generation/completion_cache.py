"""A bounded LRU cache of finished deterministic generations (temperature 0, not streamed).

Only greedy requests are cached: any other request may legitimately answer differently each time.
The key holds everything that changes a greedy answer (prompt token ids, token limit, stop strings
and stop tokens, ignore_eos); the value is the generated text, token count and finish reason.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock


@dataclass(frozen=True)
class CachedGeneration:
    text: str
    num_output_tokens: int
    finish_reason: str


CacheKey = tuple


class CompletionCache:
    """LRU of CachedGeneration by CacheKey; capacity 0 disables it."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("completion cache size must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[CacheKey, CachedGeneration] = OrderedDict()
        self._lock = Lock()

    @staticmethod
    def key(prompt_token_ids: list[int], max_tokens: int, stop: list[str], stop_token_ids: list[int],
            ignore_eos: bool) -> CacheKey:
        return (tuple(prompt_token_ids), max_tokens, tuple(stop), tuple(stop_token_ids), ignore_eos)

    def get(self, key: CacheKey) -> CachedGeneration | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: CacheKey, value: CachedGeneration) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
