"""Burstiness inside a window: the simulated arrivals carry the inter-arrival CV the series recorded."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.sim.bursts import bursty_flow, renewal_arrivals, step_cv
from preheat.sim.run import FLUID_STEP_S, SimSettings, prepare_workload
from preheat.sim.traces import SeriesTrace

CVS = (0.5, 1.0, 2.0, 4.0)


def series(per_cv: int = 60, rate: float = 200.0) -> SeriesTrace:
    cv = np.repeat(CVS, per_cv).astype(float)
    t = np.arange(len(cv)) * 600.0
    return SeriesTrace("synthetic", t, np.full(len(cv), rate), 600.0, "series", cv=cv)


def test_fluid_step_counts_reproduce_the_recorded_cv_within_10_percent():
    trace = series()
    t = np.arange(int(trace.duration_s // FLUID_STEP_S)) * FLUID_STEP_S
    flow = bursty_flow(np.full(len(t), 200.0), step_cv(trace, t), FLUID_STEP_S, seed=1)
    counts, cv = flow * FLUID_STEP_S, step_cv(trace, t)
    for c in CVS:
        x = counts[cv == c]
        assert np.mean(x) == pytest.approx(200.0 * FLUID_STEP_S, rel=0.05)
        # a renewal process's index of dispersion is cv^2: the count variance is cv^2 x the mean count
        assert np.sqrt(np.var(x) / np.mean(x)) == pytest.approx(c, rel=0.10)
        # and so is that of whole windows (sums of 40 steps)
        w = x.reshape(-1, 40).sum(axis=1)
        assert np.sqrt(np.var(w) / np.mean(w)) == pytest.approx(c, rel=0.25)


def test_the_workload_carries_the_noise_and_smooth_turns_it_off():
    trace = series(per_cv=4)
    bursty = prepare_workload(trace, SimSettings()).curve_rate
    smooth = prepare_workload(trace, SimSettings(bursty=False)).curve_rate
    assert np.allclose(smooth, 200.0)
    assert np.std(bursty) > 10 * np.std(smooth) and np.mean(bursty) == pytest.approx(200.0, rel=0.05)
    # the same seed gives the same arrivals for every policy
    assert np.array_equal(bursty, prepare_workload(trace, SimSettings()).curve_rate)


def test_renewal_arrivals_have_the_recorded_interarrival_cv_within_10_percent():
    trace = series(per_cv=3, rate=50.0)
    for i, c in enumerate(CVS):
        start = i * 3 * 600.0
        req = renewal_arrivals(trace, start, start + 1800.0, seed=2)
        gaps = np.diff(req.arrival_s)
        assert len(req.arrival_s) == pytest.approx(50.0 * 1800.0, rel=0.1 * c + 0.05)
        assert np.std(gaps) / np.mean(gaps) == pytest.approx(c, rel=0.10)
