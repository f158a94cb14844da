"""Sentence embeddings: a plain-torch BERT encoder (all-MiniLM-L6-v2) behind a dynamic batcher."""

from preheat_server.embeddings.batcher import EmbeddingBatcher
from preheat_server.embeddings.model import BUILTIN_EMBEDDING_MODELS, EmbeddingModel, is_embedding_model

__all__ = ["BUILTIN_EMBEDDING_MODELS", "EmbeddingBatcher", "EmbeddingModel", "is_embedding_model"]
