"""Turn a trace into a replay schedule: when each request is sent and how big it is.

Two kinds of trace feed the load generator:

* per-request traces (Azure LLM 2023, Mooncake): each row already is a request; time is divided by
  the compression factor and the rate scale thins (scale < 1) or repeats with jitter (scale > 1).
* per-window rate series (ServeGen, 10-minute counts): the rate is interpolated linearly between
  window centres and arrivals are drawn as a non-homogeneous Poisson process (thinning).

Token counts are scaled down and capped because every serving replica here shares two CPU cores
with everything else: the shape of the load matters, not the absolute size of each request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Arrival:
    """One request of the replay: its send offset (seconds after start) and its size."""

    t_s: float
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class TokenShaping:
    """How trace token counts become request sizes a 2-core cluster can serve.

    prompt = clamp(round(context × prompt_scale), prompt_min, prompt_max), likewise max_tokens.
    """

    prompt_scale: float = 1 / 64
    prompt_min: int = 4
    prompt_max: int = 48
    output_scale: float = 1 / 2
    output_min: int = 4
    output_max: int = 16

    def __post_init__(self) -> None:
        if self.prompt_scale <= 0 or self.output_scale <= 0:
            raise ValueError("token scales must be > 0")
        if not (1 <= self.prompt_min <= self.prompt_max) or not (1 <= self.output_min <= self.output_max):
            raise ValueError("token bounds must satisfy 1 <= min <= max")

    def prompt(self, context_tokens: float) -> int:
        return _clamp(round(context_tokens * self.prompt_scale), self.prompt_min, self.prompt_max)

    def output(self, generated_tokens: float) -> int:
        return _clamp(round(generated_tokens * self.output_scale), self.output_min, self.output_max)


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(x)))


def from_requests(
    times_s: Sequence[float],
    context_tokens: Sequence[float],
    generated_tokens: Sequence[float],
    *,
    compress: float = 1.0,
    rate_scale: float = 1.0,
    start_s: float | None = None,
    duration_s: float | None = None,
    shaping: TokenShaping | None = None,
    seed: int = 0,
) -> list[Arrival]:
    """Schedule a per-request trace: offsets are (t - start) / compress.

    `start_s`/`duration_s` pick a slice in trace time (before compression). `rate_scale` < 1 keeps
    each request with that probability; > 1 adds copies with a small uniform jitter (so the mix of
    sizes is kept and the burst structure roughly too).
    """
    if compress <= 0 or rate_scale <= 0:
        raise ValueError("compress and rate_scale must be > 0")
    if not (len(times_s) == len(context_tokens) == len(generated_tokens)):
        raise ValueError("times, context tokens and generated tokens must have the same length")
    shaping = shaping or TokenShaping()
    rng = np.random.default_rng(seed)
    t = np.asarray(times_s, dtype=float)
    if t.size == 0:
        return []
    t0 = float(t.min()) if start_s is None else float(start_s)
    keep = t >= t0
    if duration_s is not None:
        keep &= t < t0 + duration_s
    out: list[Arrival] = []
    whole = math.floor(rate_scale)
    frac = rate_scale - whole
    for i in np.flatnonzero(keep):
        copies = whole + (1 if rng.random() < frac else 0)
        base = (t[i] - t0) / compress
        for c in range(copies):
            # copies beyond the first land within a second of trace time of the original
            jitter = 0.0 if c == 0 else float(rng.uniform(0.0, 1.0)) / compress
            out.append(
                Arrival(float(base + jitter), shaping.prompt(context_tokens[i]), shaping.output(generated_tokens[i]))
            )
    out.sort(key=lambda a: a.t_s)
    return out


def from_rate_series(
    times_s: Sequence[float],
    rates_rps: Sequence[float],
    *,
    compress: float,
    rate_scale: float,
    window_s: float | None = None,
    start_s: float | None = None,
    duration_s: float | None = None,
    prompt_tokens: tuple[int, int] = (8, 24),
    max_tokens: tuple[int, int] = (4, 8),
    seed: int = 0,
) -> list[Arrival]:
    """Draw per-request arrivals from a windowed rate series (ServeGen 10-minute counts).

    The replayed rate at replay time x is rate(t0 + x·compress) × rate_scale, with rate linearly
    interpolated between window centres; so compress=240 plays a 10-minute window in 2.5 s. Request
    sizes are uniform in the given inclusive ranges (the series has no token counts). Windows whose
    rate is NaN are treated as missing and bridged by interpolation.
    """
    if compress <= 0 or rate_scale <= 0:
        raise ValueError("compress and rate_scale must be > 0")
    t = np.asarray(times_s, dtype=float)
    r = np.asarray(rates_rps, dtype=float)
    if t.size == 0 or t.size != r.size:
        raise ValueError("times and rates must be non-empty and of the same length")
    ok = np.isfinite(r) & (r >= 0)
    if not ok.any():
        raise ValueError("the rate series has no usable window")
    t, r = t[ok], r[ok]
    if window_s is None:
        window_s = float(np.median(np.diff(t))) if t.size > 1 else 600.0
    centres = t + window_s / 2
    t0 = float(t.min()) if start_s is None else float(start_s)
    t_end = float(t.max()) + window_s if duration_s is None else t0 + duration_s
    span = (t_end - t0) / compress  # replay seconds
    if span <= 0:
        return []

    def rate_at(x: np.ndarray) -> np.ndarray:
        return np.interp(t0 + x * compress, centres, r) * rate_scale

    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, span, 2048)
    peak = float(rate_at(grid).max())
    if peak <= 0:
        return []
    # thinning (Lewis & Shedler): candidates at the peak rate, kept with probability rate(x)/peak
    n = rng.poisson(peak * span)
    cand = np.sort(rng.uniform(0.0, span, n))
    kept = cand[rng.uniform(0.0, peak, n) < rate_at(cand)]
    p = rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, kept.size)
    m = rng.integers(max_tokens[0], max_tokens[1] + 1, kept.size)
    return [Arrival(float(x), int(a), int(b)) for x, a, b in zip(kept, p, m, strict=True)]


def offered_rate(arrivals: Sequence[Arrival], bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Requests per second offered in each bin: (bin start times, rates)."""
    if not arrivals:
        return np.zeros(0), np.zeros(0)
    end = max(a.t_s for a in arrivals)
    edges = np.arange(0.0, end + bin_s, bin_s)
    if edges.size < 2:
        edges = np.array([0.0, bin_s])
    counts, _ = np.histogram([a.t_s for a in arrivals], bins=edges)
    return edges[:-1], counts / bin_s


def from_trace(
    trace: object,
    *,
    compress: float,
    rate_scale: float = 1.0,
    start_s: float | None = None,
    duration_s: float | None = None,
    shaping: TokenShaping | None = None,
    seed: int = 0,
) -> list[Arrival]:
    """Schedule a trace read by `preheat.sim.traces.load_trace` (per-request or per-window series).

    `start_s` and `duration_s` are in trace time: seconds from the first request for per-request
    traces, the series' own `t_s` for window series.
    """
    kind = getattr(trace, "kind", None)
    if kind == "requests":
        n = len(trace.arrival_s)  # type: ignore[attr-defined]
        ctx = trace.input_tokens if trace.input_tokens is not None else np.full(n, 512.0)  # type: ignore[attr-defined]
        gen = trace.output_tokens if trace.output_tokens is not None else np.full(n, 16.0)  # type: ignore[attr-defined]
        return from_requests(
            trace.arrival_s, ctx, gen, compress=compress, rate_scale=rate_scale,  # type: ignore[attr-defined]
            start_s=start_s, duration_s=duration_s, shaping=shaping, seed=seed,
        )
    if kind == "series":
        return from_rate_series(
            trace.t_s, trace.rate_rps, compress=compress, rate_scale=rate_scale,  # type: ignore[attr-defined]
            window_s=trace.window_s, start_s=start_s, duration_s=duration_s, seed=seed,  # type: ignore[attr-defined]
        )
    raise ValueError(f"not a trace from preheat.sim.traces.load_trace: {type(trace).__name__}")
