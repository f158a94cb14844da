"""The closed loop's default workload: ServeGen m-small's overnight trough and morning ramp.

Day 2 of m-small from 03:30 for 8 hours: about 400 req/s at the trough rising ~2.7x by 11:30, a ramp
a daily forecast can see coming. 240x compression plays it in 120 s; 0.4 % of the real rate puts
the trough at ~2 serving replicas and the peak at ~4 of the tiny model on two shared cores.

The trace before the slice (day 1 and day 2's night, up to two days) is the endpoint's past: the run
writes it into Prometheus, compressed and scaled the same way, so the operator's forecaster starts
from "yesterday" as a production operator's would (preheat_lab.closedloop.history).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preheat_lab.loadgen import Arrival, from_trace

COMPRESS = 240.0
RATE_SCALE = 0.004
SLICE_START_IN_DAY_S = 3.5 * 3600
SLICE_DURATION_S = 8 * 3600
HISTORY_S = 2 * 86400.0  # what the operator replays from Prometheus: two seasons of its daily forecaster


@dataclass(frozen=True)
class Workload:
    """The replayed slice and the endpoint's past before it (trace seconds, from the trace's start)."""

    arrivals: list[Arrival]
    rate: Any  # trace seconds -> replayed requests/s (numpy array in, array out)
    slice_start_s: float
    history_start_s: float

    @property
    def history_s(self) -> float:
        return self.slice_start_s - self.history_start_s


def load_workload(trace_path: str | Path, *, start_s: float, duration_s: float = SLICE_DURATION_S,
                  compress: float = COMPRESS, rate_scale: float = RATE_SCALE, seed: int = 0,
                  history_s: float = HISTORY_S) -> Workload:
    """Arrivals of [start_s, start_s + duration_s) of a rate-series trace, and the rate function of the
    (up to) `history_s` before it. `start_s` is in seconds from the trace's first window."""
    from preheat.sim.traces import load_trace

    from .history import rate_function

    trace = load_trace(trace_path)
    arrivals = from_trace(trace, compress=compress, rate_scale=rate_scale, start_s=start_s,
                          duration_s=duration_s, seed=seed)
    if getattr(trace, "kind", None) != "series":
        raise ValueError("the endpoint's past is written from a per-window rate series (ServeGen)")
    rate = rate_function(trace.t_s, trace.rate_rps, trace.window_s, rate_scale)
    first = float(trace.t_s.min())
    return Workload(arrivals, rate, float(start_s), max(first, float(start_s) - history_s))


def ramp_arrivals(trace_path: str | Path, *, day: int = 1, compress: float = COMPRESS,
                  rate_scale: float = RATE_SCALE, seed: int = 0) -> list[Arrival]:
    """Arrivals of the morning-ramp slice of day `day` (0-based; the committed excerpt holds day 2
    only, so pass day=0 for it) of a ServeGen series."""
    from preheat.sim.traces import load_trace

    trace = load_trace(trace_path)
    return from_trace(trace, compress=compress, rate_scale=rate_scale,
                      start_s=day * 86400 + SLICE_START_IN_DAY_S, duration_s=SLICE_DURATION_S, seed=seed)
