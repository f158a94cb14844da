"""A BERT encoder with mean pooling in plain torch: all-MiniLM-L6-v2 without transformers.

Padding-free (like text-embeddings-inference): the tokens of every input of a batch run back to back
as one [N, H] matrix through every linear, LayerNorm and GELU, so a batch costs its real tokens, not
inputs x longest. Only attention needs per-input rows: the fused q/k/v rows are gathered into a padded
[B, T] view for one masked attention call and the result is gathered back. Mean pooling sums each
input's rows. A batch of mixed
lengths (22.6 tokens on average in the HTTP benchmark, padded to ~34) did ~1.5x the GEMM work padded.
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

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Single-segment inputs: token type 0 everywhere.
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


@dataclass
class Layout:
    """Where each of a batch's N flat token rows sits in the padded [B, T] attention view."""

    batch: int
    longest: int
    pad_index: torch.Tensor  # [N] row b * T + t of each flat token
    gather_index: torch.Tensor  # [B * T] flat row of each padded slot; N (a zero row) for padding
    bias: torch.Tensor | None  # [B, 1, 1, T] additive key mask; None when every input has length T

    @classmethod
    def of(cls, lengths: list[int], device: torch.device) -> Layout:
        b, t = len(lengths), max(lengths)
        pad_index = torch.cat([torch.arange(n) + i * t for i, n in enumerate(lengths)])
        gather_index = torch.full((b * t,), len(pad_index), dtype=torch.long)
        gather_index[pad_index] = torch.arange(len(pad_index))
        bias = None
        if any(n != t for n in lengths):
            keep = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
            bias = torch.zeros((b, t)).masked_fill(~keep, torch.finfo(torch.float32).min)
            bias = bias[:, None, None, :].to(device)
        return cls(b, t, pad_index.to(device), gather_index.to(device), bias)

    def pad(self, y: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [B, T, H], zeros in the padding."""
        if self.bias is None:
            return y.view(self.batch, self.longest, -1)
        # One gather from y plus a zero row. Padded keys and values must be finite (a zero attention
        # weight times a NaN is still NaN); zero-fill + index_copy_ was slower, at bf16 by far.
        return torch.cat([y, y.new_zeros((1, y.shape[-1]))]).index_select(0, self.gather_index).view(
            self.batch, self.longest, -1)

    def unpad(self, y: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> [N, H]."""
        flat = y.reshape(self.batch * self.longest, -1)
        return flat if self.bias is None else flat.index_select(0, self.pad_index)


# Longest padded input for which attention runs as two plain matmuls. aten's flash-attention kernel
# for CPU pays a fixed cost per (input, head) block that dominates for short inputs (B=32, T=28: 2.5 vs
# 0.7 ms per layer on 2 cores); from T ~ 64 on it wins and its memory stays O(T), not O(T^2).
SHORT_ATTENTION_MAX_LEN = 48


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v over [B, heads, T, d]."""
    if q.shape[-2] > SHORT_ATTENTION_MAX_LEN:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias if bias is None else bias.to(q.dtype))
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    if bias is not None:
        scores.add_(bias)
    return torch.matmul(scores.softmax(-1), v)


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.qkv: nn.Linear | None = None   # built by fuse_qkv() once the weights are loaded

    def fuse_qkv(self) -> None:
        """One [3H, H] projection instead of three: one wider GEMM and one gather into the padded view."""
        h = self.query.in_features
        fused = nn.Linear(h, 3 * h).to(self.query.weight.device, self.query.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([self.query.weight, self.key.weight, self.value.weight]))
            fused.bias.copy_(torch.cat([self.query.bias, self.key.bias, self.value.bias]))
        self.qkv = fused
        del self.query, self.key, self.value   # the fused copy is the only one kept

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        h = x.shape[-1]
        b, t = layout.batch, layout.longest
        assert self.qkv is not None, "BertEncoder.from_folder fuses q/k/v after loading"
        # [B, T, 3, heads, d] -> three [B, heads, T, d] views
        q, k, v = layout.pad(self.qkv(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        return layout.unpad(_attention(q, k, v, layout.bias).transpose(1, 2))


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

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        a = self.attention.output(self.attention.self(x, layout), x)
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
    def hidden_states(self, seqs: list[list[int]]) -> tuple[torch.Tensor, Layout]:
        """Flat hidden states [N, H] of every token of ``seqs``, back to back, and their layout."""
        if not seqs or any(not s for s in seqs):
            raise ValueError("every input needs at least one token")
        device = self.embeddings.word_embeddings.weight.device
        layout = Layout.of([len(s) for s in seqs], device)
        ids = torch.tensor([i for s in seqs for i in s], dtype=torch.long, device=device)
        x = self.embeddings(ids, layout.pad_index % layout.longest)   # position = column in the padded view
        for layer in self.encoder.layer:
            x = layer(x, layout)
        return x, layout

    @torch.inference_mode()
    def embed(self, seqs: list[list[int]]) -> torch.Tensor:
        """Unit-length sentence embeddings [B, H]: the mean of each input's token states, normalised."""
        hidden, layout = self.hidden_states(seqs)
        hidden = hidden.float()   # pool and normalise in fp32 whatever the weights
        owner = layout.pad_index // layout.longest   # input = row in the padded view
        sums = hidden.new_zeros((layout.batch, hidden.shape[-1])).index_add_(0, owner, hidden)
        pooled = sums / torch.bincount(owner, minlength=layout.batch).to(hidden.dtype)[:, None]
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
        model = model.to(device).eval()
        for layer in model.encoder.layer:
            layer.attention.self.fuse_qkv()
        return model

