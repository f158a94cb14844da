"""Synthetic one-hour chat traffic: a check for the kind of trace the project does not have.

Issue 15 names a bursty one-hour chat trace among the production traces Preheat is judged on; the
shared traces hold its code-completion sibling (`azure_llm_2023_code.csv`) and a conversation trace
with a steady rate (Mooncake), nothing in between. This draws one: a Markov-modulated Poisson
process whose rate is redrawn every `segment_s` (AR(1) in log space, coefficient 0.8, innovations
`sigma`; 0 is plain Poisson) around ~5.4 requests/s (a conversation service's hour, as the Azure 2023
conversation trace's 19 k requests) with a slow swing over the hour, and log-normal token counts
(input median ~1,000, output ~130). A lab check, not a production trace: no season, no trend beyond
the swing, bursts shorter than a lead time. The presets are the three draws of the README:

    mild    sigma 0.15, 60 s segments   (the rate wanders by ~25 % a minute)
    medium  sigma 0.25, 30 s segments
    bursty  sigma 0.35, 20 s segments, no swing

    python -m preheat_lab.chat_traffic OUT.csv [--preset medium] [--seed 1]
    preheat frontier --trace OUT.csv --cold-start 30 --jobs 2 --json F.json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HOUR_S = 3600.0
RATE = 5.4  # requests/s around which the rate moves
AR = 0.8  # the log-rate's memory from one segment to the next


@dataclass(frozen=True)
class Shape:
    sigma: float  # innovations of the log-rate per segment
    segment_s: float  # how long the rate holds before it is redrawn
    swing: float  # amplitude of the slow swing over the hour, in log-rate


PRESETS = {
    "mild": Shape(0.15, 60.0, 0.25),
    "medium": Shape(0.25, 30.0, 0.25),
    "bursty": Shape(0.35, 20.0, 0.0),
}


def segment_rates(shape: Shape, seed: int, duration_s: float = HOUR_S) -> np.ndarray:
    """Requests/s in each segment: RATE x exp(AR(1) log-rate + the swing)."""
    if not (shape.sigma >= 0.0 and shape.segment_s > 0.0 and duration_s > 0.0):
        raise ValueError(f"need sigma >= 0, segment_s > 0 and a positive duration, got {shape}, {duration_s}")
    rng = np.random.default_rng(seed)
    n = int(np.ceil(duration_s / shape.segment_s))
    log_rate, out = 0.0, np.empty(n)
    for i in range(n):
        log_rate = AR * log_rate + rng.normal(0.0, shape.sigma)
        out[i] = log_rate
    start = np.arange(n) * shape.segment_s
    return RATE * np.exp(out + shape.swing * np.sin(2 * np.pi * start / duration_s))


def requests(shape: Shape, seed: int, duration_s: float = HOUR_S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival times in s, input tokens, output tokens): Poisson counts per segment at `segment_rates`,
    spread uniformly in their segment."""
    rates = segment_rates(shape, seed, duration_s)
    rng = np.random.default_rng(seed + 1_000_003)  # arrivals apart from the rate's draws
    counts = rng.poisson(rates * shape.segment_s)
    starts = np.arange(len(rates)) * shape.segment_s
    t = np.concatenate([s + np.sort(rng.random(c)) * shape.segment_s for s, c in zip(starts, counts, strict=True)])
    t = t[t < duration_s]
    inp = np.maximum(1, rng.lognormal(6.9, 0.7, len(t)).astype(int))
    out = np.maximum(1, rng.lognormal(4.9, 0.9, len(t)).astype(int))
    return t, inp, out


def write(path: Path, shape: Shape, seed: int) -> int:
    """Draw an hour of `shape` from `seed` into a per-request CSV (timestamp, token counts); the request count."""
    t, inp, out = requests(shape, seed)
    rows = "\n".join(f"{x:.3f},{i},{o}" for x, i, o in zip(t, inp, out, strict=True))
    path.write_text("timestamp,input_tokens,output_tokens\n" + rows + "\n")
    return len(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.chat_traffic", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="medium")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sigma", type=float, help="override the preset's log-rate innovations")
    ap.add_argument("--segment-s", type=float, help="override the preset's segment length")
    args = ap.parse_args(argv)
    base = PRESETS[args.preset]
    shape = Shape(base.sigma if args.sigma is None else args.sigma,
                  base.segment_s if args.segment_s is None else args.segment_s, base.swing)
    try:
        n = write(args.out, shape, args.seed)
    except ValueError as e:
        ap.error(str(e))
    print(f"{args.out}: {n} requests over one hour ({args.preset}, sigma {shape.sigma:g}, "
          f"{shape.segment_s:g} s segments, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
