"""How much does a precision cost in quality on *your* text? Perplexity delta, greedy agreement, bytes.

    python -m preheat_server.quant.evaluate --model smollm2-135m --text model-server/eval/apache-2.0.txt \
        --precisions fp32 int8 int4 q8_0 q4_0

For each precision: perplexity of the text (teacher-forced, in windows of ``--window`` tokens), its
change against the reference (the first precision listed, unquantized), the share of positions where
the greedy next token equals the reference's, and the weight bytes.

``q8_0`` / ``q4_0`` are llama.cpp's formats for comparison: every matrix is quantized with the `gguf`
package's reference implementation of llama.cpp's quantizer (blocks of 32, one fp16 scale each) and
dequantized back, then run through the same fp32 forward pass, so only the weight format differs. For
``q4_0`` a tied embedding / output table is Q8_0, standing in for the Q6_K llama.cpp gives it in its
Q4_0 files (`gguf` cannot write Q6_K; Q8_0 is the more accurate of the two, so this favours llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from ..models import load_model


@torch.inference_mode()
def window_logits(model, ids: list[int], window: int) -> list[torch.Tensor]:
    """Logits [n, V] (float32) for consecutive windows of ``ids``."""
    out = []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        out.append(model.forward_dense(torch.tensor([chunk[:-1]], device=_device(model)))[0].float().cpu())
    return out


def _device(model) -> torch.device:
    for b in model.buffers():
        return b.device
    return next(model.parameters()).device


LLAMA_CPP_FORMATS = ("q8_0", "q4_0")


def _gguf_roundtrip(w: torch.Tensor, fmt: str) -> torch.Tensor:
    import gguf
    from gguf.quants import dequantize, quantize

    kind = gguf.GGMLQuantizationType[fmt.upper()]
    arr = w.detach().float().cpu().numpy()
    return torch.from_numpy(dequantize(quantize(arr, kind), kind).reshape(arr.shape).copy()).to(w.dtype)


def load_llama_cpp_format(model_name: str, fmt: str, device: str):
    """The fp32 model with every matrix rounded through llama.cpp's ``fmt`` (see the module docstring)."""
    loaded = load_model(model_name, device=device, precision="fp32", prepack=False)
    model = loaded.model
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear | torch.nn.Embedding) and not (tied and name == "lm_head"):
                table = isinstance(mod, torch.nn.Embedding) or name == "lm_head"
                mod.weight.copy_(_gguf_roundtrip(mod.weight, "q8_0" if fmt == "q4_0" and table else fmt))
    return loaded


def evaluate(model_name: str, text: str, precisions: list[str], device: str = "cpu", window: int = 256,
             max_tokens: int = 4096) -> list[dict]:
    results: list[dict] = []
    ref_greedy: torch.Tensor | None = None
    ids: list[int] = []
    for prec in precisions:
        loaded = (load_llama_cpp_format(model_name, prec, device) if prec in LLAMA_CPP_FORMATS
                  else load_model(model_name, device=device, precision=prec))
        if not ids:
            ids = loaded.tokenizer.encode(text)[: max_tokens + 1]
            if len(ids) < 2:
                raise ValueError("the text has fewer than 2 tokens: nothing to evaluate")
        logits = window_logits(loaded.model, ids, window)
        targets = []
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start : start + window + 1]
            if len(chunk) >= 2:
                targets.append(torch.tensor(chunk[1:]))
        lg, tg = torch.cat(logits), torch.cat(targets)
        nll = torch.nn.functional.cross_entropy(lg, tg, reduction="mean").item()
        greedy = lg.argmax(-1)
        if ref_greedy is None:
            ref_greedy = greedy
        results.append(
            {
                "precision": prec,
                "perplexity": math.exp(nll),
                "greedy_agreement": float((greedy == ref_greedy).float().mean()),
                "weight_bytes": _format_bytes(loaded, prec),
                "tokens": int(tg.numel()),
            }
        )
        del loaded
    base = results[0]["perplexity"]
    for r in results:
        r["perplexity_delta"] = r["perplexity"] - base
        r["perplexity_delta_pct"] = 100.0 * (r["perplexity"] / base - 1.0)
    return results


def _format_bytes(loaded, prec: str) -> int:
    if prec not in LLAMA_CPP_FORMATS:
        return loaded.weight_bytes
    # Bytes the format would take: 34 per 32 weights (Q8_0), 18 per 32 (Q4_0); tables Q8_0; norms fp32.
    total, seen = 0, set()
    for name, t in loaded.model.state_dict().items():
        if t.data_ptr() in seen:   # a tied table counts once
            continue
        seen.add(t.data_ptr())
        n = t.numel()
        if t.dim() == 2:
            table = "embed" in name or "lm_head" in name
            total += n * (34 if prec == "q8_0" or table else 18) // 32
        else:
            total += 4 * n
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_server.quant.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="smollm2-135m, tiny, small, a .gguf file or a Hugging Face folder")
    ap.add_argument("--text", required=True, type=Path, help="UTF-8 text file to score")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "int8", "int4"],
                    help="first one is the reference (default: fp32 bf16 int8 int4); q8_0 / q4_0: llama.cpp's formats")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--window", type=int, default=256, help="tokens of context per scored window")
    ap.add_argument("--max-tokens", type=int, default=4096, help="score at most this many tokens")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--out", type=Path, help="also write the results with the machine record as JSON here")
    args = ap.parse_args(argv)
    try:
        text = args.text.read_text(encoding="utf-8")
        results = evaluate(args.model, text, args.precisions, args.device, args.window, args.max_tokens)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        from ..hardware import machine_record

        args.out.write_text(json.dumps({"command": " ".join(["python -m preheat_server.quant.evaluate", *(argv or sys.argv[1:])]),
                                        "machine": machine_record(), "text": str(args.text),
                                        "window": args.window, "results": results}, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'precision':<10}{'perplexity':>12}{'Δ ppl':>10}{'Δ %':>8}{'greedy agree':>14}{'weight bytes':>15}")
    for r in results:
        print(f"{r['precision']:<10}{r['perplexity']:>12.3f}{r['perplexity_delta']:>+10.3f}"
              f"{r['perplexity_delta_pct']:>+8.2f}{r['greedy_agreement']:>14.3f}{r['weight_bytes']:>15,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
