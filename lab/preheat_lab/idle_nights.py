"""A synthetic serverless endpoint: single requests at a few per second by day, none at night.

The shared traces are busy services; none has idle hours at a request rate where a replica or two
serve the day. A serverless GenAI endpoint looks like that: a daily wave of about 1-3 requests/s that
falls to nothing for a third of each day, with a weekly swing, and cold starts measured on the same
kind of service (`alibaba_cold_starts_ms.csv`). It is where the autoscalers that scale to zero by
default (Knative's KPA, KEDA) differ most from those that keep a replica (HPA, AIBrix, Preheat's
default). A lab check, not a production trace: the shape is a sine, the arrivals Poisson per minute.
`--level 1.5` lifts the wave off zero (0.3-2.7 requests/s, +-30 % over the week: never idle): the same
endpoint busy all day, where scale to zero cannot separate the policies and what remains is sizing a
fleet of one to four.

    python -m preheat_lab.idle_nights OUT.csv [--days 23] [--seed 1] [--level 0.6]
    preheat frontier --trace OUT.csv --cold-start ../shared/traces/alibaba_cold_starts_ms.csv --jobs 2 --json F.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from preheat.scaling.forecast import DAY_S

WEEK_S = 7 * DAY_S


AMPLITUDE = 1.2  # the daily wave's, requests/s
IDLE_LEVEL = 0.6  # its middle, requests/s: below the amplitude it is cut at zero a third of the day


def rate_per_s(t_s: np.ndarray, level: float = IDLE_LEVEL) -> np.ndarray:
    """Requests/s at each time: a daily wave around `level` (cut at zero for a third of the day at the
    default), +-30 % over the week."""
    daily = np.clip(AMPLITUDE * np.sin(2 * np.pi * (t_s / DAY_S - 0.3)) + level, 0.0, None)
    return daily * (1.0 + 0.3 * np.sin(2 * np.pi * t_s / WEEK_S))


def arrivals(days: int, seed: int, level: float = IDLE_LEVEL) -> np.ndarray:
    """Arrival times (s): Poisson counts per minute at `rate_per_s`, spread uniformly in their minute."""
    if days < 1:
        raise ValueError(f"--days must be >= 1, got {days}")
    if not level >= 0.0:
        raise ValueError(f"--level must be >= 0 requests/s, got {level}")
    rng = np.random.default_rng(seed)
    minutes = np.arange(0.0, days * DAY_S, 60.0)
    counts = rng.poisson(rate_per_s(minutes, level) * 60.0)
    return np.concatenate([m + np.sort(rng.random(c)) * 60.0 for m, c in zip(minutes, counts, strict=True)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.idle_nights", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--days", type=int, default=23)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--level", type=float, default=IDLE_LEVEL,
                    help=f"the daily wave's middle in requests/s (amplitude {AMPLITUDE:g}; default "
                         f"{IDLE_LEVEL:g}: idle a third of the day; from {AMPLITUDE:g} on never idle)")
    args = ap.parse_args(argv)
    try:
        times = arrivals(args.days, args.seed, args.level)
    except ValueError as e:
        ap.error(str(e))
    args.out.write_text("timestamp\n" + "\n".join(f"{x:.3f}" for x in times) + "\n")
    print(f"{args.out}: {len(times)} requests over {args.days} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
