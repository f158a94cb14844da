"""Models the server can load: the Llama decoder, its config, tokenizer, loader and built-in models."""

from .builtin import BUILTIN_MODELS, cache_root, ensure_builtin
from .config import ModelConfig
from .llama import LlamaForCausalLM
from .loader import PRECISIONS, LoadedModel, load_model
from .tokenizer import Tokenizer

__all__ = [
    "BUILTIN_MODELS",
    "PRECISIONS",
    "LlamaForCausalLM",
    "LoadedModel",
    "ModelConfig",
    "Tokenizer",
    "cache_root",
    "ensure_builtin",
    "load_model",
]
