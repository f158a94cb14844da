"""Next-token choice per sequence: greedy, or temperature / top-k / top-p with a per-request RNG."""

from __future__ import annotations

import torch

from ..sampling import TokenLogprob
from .sequence import Sequence


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already cover top_p (the first always stays).
        drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """``logits`` [B, V] float32, one row per sequence in ``seqs``."""
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int] = []
    for i, seq in enumerate(seqs):
        p = seq.params
        if p.temperature == 0.0:
            out.append(int(greedy[i]))
            continue
        if seq.generator is None:
            # Seeded requests are reproducible; others draw a seed from torch's global RNG.
            seed = p.seed if p.seed is not None else int(torch.randint(0, 2**62, ()).item())
            seq.generator = torch.Generator(device="cpu").manual_seed(seed)
        row = _filter(logits[i].float().cpu() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        out.append(int(torch.multinomial(probs, 1, generator=seq.generator).item()))
    return out


def token_logprobs(logprobs: torch.Tensor, targets: list[int], k: int) -> list[TokenLogprob]:
    """``logprobs`` [N, V] log-softmaxed rows; the target's log-probability and the top ``k`` of each row."""
    chosen = logprobs.gather(1, torch.tensor(targets, device=logprobs.device)[:, None])[:, 0].tolist()
    if k > 0:
        values, indices = torch.topk(logprobs, k, dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    else:
        tops = [()] * len(targets)
    return [TokenLogprob(t, c, top) for t, c, top in zip(targets, chosen, tops, strict=True)]
