"""Perplexity of int8 / int4 through their dequantized weights (fast fp32 GEMMs, same numbers).

    python model-server/bench/quant_reference_ppl.py --out bench-results/quant-smollm2-reference.json

The serving kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) equal the dequantized
reference (tests/server/test_quant.py) but are slow at 512-row prefills on this CPU (the evaluator's
int4 pass did not finish 4 windows in 30 min under load 13), so the quality figure is computed here:
the same recipe as `quantize_model` (int8 per row; int4 in groups of the checkpoint's block size or
int4_group_size, bf16 scales/zeros, a tied table int8) applied to the fp32 weights, then dequantized.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from preheat_server.hardware import machine_record
from preheat_server.models import load_model
from preheat_server.quant.evaluate import window_logits
from preheat_server.quant.quantize import (
    INT4_GROUP_SIZE,
    dequantize_int4,
    int4_group_size,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)


def dequantized(model_name: str, precision: str):
    loaded = load_model(model_name, device="cpu", precision="fp32", prepack=False)
    m = loaded.model
    block = int(loaded.config.extra.get("quantization_block_size") or INT4_GROUP_SIZE)
    tied = m.config.tie_word_embeddings
    with torch.no_grad():
        for name, mod in m.named_modules():
            if not isinstance(mod, torch.nn.Linear) or (tied and name == "lm_head"):
                continue
            w = mod.weight.data
            if precision == "int8" or name == "lm_head":
                q, s = quantize_int8_per_channel(w)
                mod.weight.data = q.float() * s[:, None]
            else:
                g = int4_group_size(w.shape[1], block)
                q, sz = quantize_int4_groupwise(w, g)
                mod.weight.data = dequantize_int4(q, sz.to(torch.bfloat16).float(), g)
        emb = m.model.embed_tokens.weight
        if precision == "int8" or tied:
            q, s = quantize_int8_per_channel(emb.data)
            emb.data.copy_(q.float() * s[:, None])
        else:
            g = int4_group_size(emb.shape[1], block)
            q, sz = quantize_int4_groupwise(emb.data, g)
            emb.data.copy_(dequantize_int4(q, sz.to(torch.bfloat16).float(), g))
    return loaded


def perplexity(loaded, ids: list[int], window: int) -> float:
    lg = torch.cat(window_logits(loaded.model, ids, window))
    tg = torch.cat([torch.tensor(ids[s + 1 : s + window + 1]) for s in range(0, len(ids) - 1, window)])
    return math.exp(torch.nn.functional.cross_entropy(lg, tg).item())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--text", type=Path, default=Path("model-server/eval/apache-2.0.txt"))
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    base = load_model(args.model, device="cpu", precision="fp32", prepack=False)
    ids = base.tokenizer.encode(args.text.read_text(encoding="utf-8"))[: args.max_tokens + 1]
    results = {"fp32": perplexity(base, ids, args.window)}
    del base
    for prec in ("int8", "int4"):
        results[prec] = perplexity(dequantized(args.model, prec), ids, args.window)
    out = {"command": "python model-server/bench/quant_reference_ppl.py " + " ".join(argv or sys.argv[1:]),
           "machine": machine_record(), "tokens": len(ids) - 1, "window": args.window, "perplexity": results,
           "delta_pct": {k: 100 * (v / results["fp32"] - 1) for k, v in results.items()}}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["perplexity"]), json.dumps(out["delta_pct"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
