"""The inference engine: continuous batching over a paged KV cache with prefix caching (no HTTP)."""

from .block_manager import BlockManager
from .llm_engine import EngineConfig, EngineStats, LLMEngine, RequestOutput
from .sequence import SamplingParams

__all__ = ["BlockManager", "EngineConfig", "EngineStats", "LLMEngine", "RequestOutput", "SamplingParams"]
