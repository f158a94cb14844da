"""`preheat_lab.idle_nights`: the synthetic serverless endpoint is idle where its rate is zero and loads as a trace."""

from __future__ import annotations

import numpy as np
import pytest
from preheat.scaling.forecast import DAY_S
from preheat.sim.traces import load_trace
from preheat_lab.idle_nights import arrivals, main, rate_per_s


def test_nights_are_idle_and_a_seed_draws_the_same_requests(tmp_path):
    t = arrivals(2, seed=1)
    assert np.all(np.diff(t) >= 0) and t[-1] < 2 * DAY_S
    minute = np.floor(t / 60.0) * 60.0
    assert np.all(rate_per_s(minute) > 0)  # no request in a minute whose rate is zero
    idle = np.mean(rate_per_s(np.arange(0.0, DAY_S, 60.0)) == 0)
    assert 0.3 < idle < 0.4  # a third of each day
    assert np.array_equal(t, arrivals(2, seed=1)) and not np.array_equal(t, arrivals(2, seed=2))


def test_written_trace_loads_as_requests_and_bad_days_are_refused(tmp_path, capsys):
    out = tmp_path / "n.csv"
    assert main([str(out), "--days", "1"]) == 0
    trace = load_trace(str(out))
    assert len(trace.arrival_s) == len(arrivals(1, seed=1))
    with pytest.raises(SystemExit):
        main([str(out), "--days", "0"])
    assert "--days must be >= 1" in capsys.readouterr().err


def test_a_level_above_the_amplitude_is_never_idle_and_a_negative_level_is_refused(capsys, tmp_path):
    minutes = np.arange(0.0, 7 * DAY_S, 60.0)
    busy = rate_per_s(minutes, level=1.5)
    assert busy.min() > 0.0  # no idle minute in a week
    assert np.all(busy >= rate_per_s(minutes))  # the same wave, lifted
    t = arrivals(1, seed=1, level=1.5)
    assert len(t) > 2 * len(arrivals(1, seed=1))  # the idle third now serves too
    with pytest.raises(SystemExit):
        main([str(tmp_path / "b.csv"), "--level", "-0.5"])
    assert "--level must be >= 0" in capsys.readouterr().err
