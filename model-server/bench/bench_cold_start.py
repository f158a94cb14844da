"""Cold start by precision: the wall time of `load_model` (what the server exports as its cold start
before the warm-up request) for fp32 and the cached int8 / int4 weights, each in a fresh process.

    python model-server/bench/bench_cold_start.py --model smollm2-135m --rounds 3 --out bench-results/cold-start.json

A first, unmeasured start of each precision fills the caches (GGUF conversion, quantized weights);
then the precisions alternate round by round, so a change in machine load hits all of them alike. The
ratio reported is the median of the per-round ratios to fp32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = ("import json, sys, torch; torch.set_num_threads(2); from preheat_server.models import load_model; "
         "m = load_model(sys.argv[1], device='cpu', precision=sys.argv[2]); "
         "print(json.dumps({'load_seconds': m.load_seconds, 'weight_bytes': m.weight_bytes}))")


def one_start(model: str, precision: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, precision], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int8", "int4"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from preheat_server.hardware import machine_record

    before = machine_record()
    for prec in args.precisions:        # fill the caches; not measured
        one_start(args.model, prec)
    rounds = []
    for _ in range(args.rounds):
        rounds.append({prec: one_start(args.model, prec) for prec in args.precisions})
    ref = args.precisions[0]
    summary = {}
    for prec in args.precisions:
        times = [r[prec]["load_seconds"] for r in rounds]
        summary[prec] = {"median_s": statistics.median(times), "times_s": times,
                         "weight_bytes": rounds[0][prec]["weight_bytes"],
                         "median_ratio_to_" + ref: statistics.median(
                             r[prec]["load_seconds"] / r[ref]["load_seconds"] for r in rounds)}
    record = {"command": "python model-server/bench/bench_cold_start.py " + " ".join(argv or sys.argv[1:]),
              "machine_before": before, "machine_after": machine_record(), "model": args.model,
              "summary": summary, "rounds": rounds}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for prec, s in summary.items():
        print(f"{prec:>5}: median {s['median_s']:.2f} s  ({s['median_ratio_to_' + ref]:.2f}x {ref}), "
              f"{s['weight_bytes'] / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
