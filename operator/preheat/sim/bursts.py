"""Arrivals inside a window, with the burstiness the trace recorded for it.

ServeGen's per-window series record the coefficient of variation `c` of inter-arrival times inside
each window. A renewal process with that CV has, over any span T much longer than a gap, a count
with mean rate*T and variance c^2 * rate*T (the index of dispersion of a renewal process is c^2).
The fluid engine draws each step's arrivals from a Gamma distribution with exactly that mean and
variance (independent steps keep the variance additive, so every span of whole steps has it too):
c = 1 is Poisson-like noise, c = 3 a bursty mix of clients, c = 0 or missing a smooth flow.
`renewal_arrivals` expands a slice into single requests (a Gamma renewal process per window) so the
fluid model can be checked against the per-request engine.
"""

from __future__ import annotations

import numpy as np

from preheat.sim.traces import RequestTrace, SeriesTrace


def step_cv(trace: SeriesTrace, t: np.ndarray) -> np.ndarray | None:
    """The recorded inter-arrival CV of the window each step starts in (None: not recorded)."""
    if trace.cv is None:
        return None
    idx = np.minimum((t // trace.window_s).astype(int), len(trace.cv) - 1)
    return trace.cv[idx]


def bursty_flow(rate: np.ndarray, cv: np.ndarray | None, step_s: float, seed: int) -> np.ndarray:
    """Per-step arrival rate with count variance cv^2 x mean count (NaN and cv <= 0 stay smooth)."""
    if cv is None:
        return rate
    mean = np.nan_to_num(rate) * step_s
    c2 = np.where(np.isfinite(cv), cv, 0.0) ** 2
    noisy = (mean > 0) & (c2 > 0)
    out = rate.copy()
    rng = np.random.default_rng(seed + 104729)
    counts = rng.gamma(mean[noisy] / c2[noisy], c2[noisy])
    out[noisy] = counts / step_s
    return out


def renewal_arrivals(trace: SeriesTrace, start_s: float, end_s: float, seed: int = 0) -> RequestTrace:
    """Single requests for [start_s, end_s): in each window a Gamma renewal process at the window's
    rate with its recorded inter-arrival CV (exponential gaps where it is not recorded)."""
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    for i, (t0, rate) in enumerate(zip(trace.t_s, trace.rate_rps, strict=True)):
        lo, hi = max(t0, start_s), min(t0 + trace.window_s, end_s)
        if hi <= lo or not np.isfinite(rate) or rate <= 0:
            continue
        c = float(trace.cv[i]) if trace.cv is not None and np.isfinite(trace.cv[i]) and trace.cv[i] > 0 else 1.0
        shape, mean_gap = 1.0 / c**2, 1.0 / rate
        n = int((hi - lo) * rate * 1.2 + 50 * c + 50)
        gaps = rng.gamma(shape, mean_gap / shape, n)
        # Start the process in equilibrium: a random point inside a first gap.
        t = lo + np.cumsum(gaps) - gaps[0] * rng.random()
        while t[-1] < hi:
            more = rng.gamma(shape, mean_gap / shape, n)
            t = np.concatenate([t, t[-1] + np.cumsum(more)])
        times.append(t[(t >= lo) & (t < hi)])
    arr = np.sort(np.concatenate(times)) if times else np.zeros(0)
    if len(arr) == 0:
        raise ValueError(f"no requests in [{start_s:g}, {end_s:g}) of {trace.name}")
    return RequestTrace(f"{trace.name}[{start_s:g}:{end_s:g}] renewal", arr - arr[0], None, None,
                        "renewal from series")
