"""The closed loop's default workload: ServeGen m-small's overnight trough and morning ramp.

Day 2 of m-small from 03:30 for 8 hours: about 400 req/s at the trough rising ~2.7x by 11:30, a ramp
a daily forecast can see coming. 240x compression plays it in 120 s; 0.4 % of the real rate puts
the trough at ~2 serving replicas and the peak at ~4 of the tiny model on two shared cores.
"""

from __future__ import annotations

from pathlib import Path

from preheat.loadgen import Arrival, from_trace

COMPRESS = 240.0
RATE_SCALE = 0.004
SLICE_START_IN_DAY_S = 3.5 * 3600
SLICE_DURATION_S = 8 * 3600


def ramp_arrivals(trace_path: str | Path, *, day: int = 1, compress: float = COMPRESS,
                  rate_scale: float = RATE_SCALE, seed: int = 0) -> list[Arrival]:
    """Arrivals of the morning-ramp slice of day `day` (0-based; the committed excerpt holds day 2
    only, so pass day=0 for it) of a ServeGen series."""
    from preheat.sim.traces import load_trace

    trace = load_trace(trace_path)
    return from_trace(trace, compress=compress, rate_scale=rate_scale,
                      start_s=day * 86400 + SLICE_START_IN_DAY_S, duration_s=SLICE_DURATION_S, seed=seed)
