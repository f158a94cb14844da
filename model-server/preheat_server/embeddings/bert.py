"""A BERT encoder with mean pooling in plain torch: all-MiniLM-L6-v2 without transformers.

Shapes: ids/mask [B, T] -> hidden [B, T, H] -> mean over unmasked tokens [B, H] -> L2-normalised.
The parameter names are the Hugging Face BertModel's, so the safetensors file loads as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text())
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        if raw.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported activation {raw.get('hidden_act')!r}")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        # Single-segment inputs: token type 0 everywhere.
        x = self.word_embeddings(ids) + self.position_embeddings(positions)[None] + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, h // self.heads).transpose(1, 2)   # [B, heads, T, d]
        out = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)),
                                             attn_mask=bias)
        return out.transpose(1, 2).reshape(b, t, h)


class _DenseNorm(nn.Module):
    """BERT's "output" block: dense projection, residual add, LayerNorm."""

    def __init__(self, d_in: int, d_out: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(c)
        self.output = _DenseNorm(c.hidden_size, c.hidden_size, c.layer_norm_eps)


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)
        self.approximate = "none" if c.hidden_act == "gelu" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x), approximate=self.approximate)


class _Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _DenseNorm(c.intermediate_size, c.hidden_size, c.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention.output(self.attention.self(x, bias), x)
        return self.output(self.intermediate(a), a)


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))


class BertEncoder(nn.Module):
    """BertModel's embeddings and encoder (no pooler) plus sentence-transformers' mean pooling."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)

    @torch.inference_mode()
    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Additive attention bias: padded keys get -inf-ish so they receive no weight.
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=ids.device)
        bias = bias.masked_fill(mask == 0, torch.finfo(torch.float32).min)[:, None, None, :]
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x

    @torch.inference_mode()
    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Unit-length sentence embeddings [B, H] for padded token ids and their attention mask."""
        hidden = self.hidden_states(ids, mask)
        m = mask.to(hidden.dtype)[..., None]
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)

    @classmethod
    def from_folder(cls, folder: Path, device: str = "cpu") -> BertEncoder:
        config = BertConfig.from_file(folder / "config.json")
        model = cls(config)
        state = load_file(str(folder / "model.safetensors"), device="cpu")
        state = {k.removeprefix("bert."): v for k, v in state.items()
                 if not k.startswith(("pooler.", "bert.pooler.")) and not k.endswith("position_ids")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not match BERT: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model.to(device).eval()

