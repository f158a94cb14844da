"""The endpoint's past for Prometheus: counter samples that continue the replay, OpenMetrics text, and a
real TSDB block from the real promtool (the binary the local cluster's Prometheus build ships)."""

from __future__ import annotations

import itertools
import json
import subprocess

import numpy as np
import pytest
from preheat_lab.closedloop.history import (
    ReloadWatch,
    TraceClock,
    counter_samples,
    openmetrics,
    rate_function,
    write_block,
)


def test_counter_samples_integrate_the_replayed_rate_on_the_compressed_clock():
    rate = rate_function(np.array([0.0, 600.0, 1200.0]), np.array([100.0, 100.0, 400.0]), 600.0, 0.01)
    clock = TraceClock(t0_wall=1000.0, t0_trace=1500.0, compress=100.0)
    assert clock.wall(clock.trace(1234.5)) == pytest.approx(1234.5)
    samples = counter_samples(rate, clock, 0.0, clock.t0_wall, step_wall_s=1.0)
    assert samples[0] == (pytest.approx(985.0), 0.0)  # trace 0 s is 15 s of wall time before the start
    assert samples[-1][0] == pytest.approx(1000.0)
    # flat at 1 req/s (100 x 0.01) up to the second window's centre (trace 900 s = wall 994 s)
    t, v = zip(*samples, strict=True)
    assert np.interp(994.0, t, v) == pytest.approx(9.0, abs=0.05)
    assert all(b >= a for a, b in itertools.pairwise(v))


def test_openmetrics_text_has_one_series_with_timestamps():
    text = openmetrics({"namespace": "ns", "endpoint": "tiny"}, [(10.0, 0.0), (12.5, 3.25)])
    assert text.splitlines() == [
        'preheat:requests_received_total{endpoint="tiny",namespace="ns"} 0.000000 10.000',
        'preheat:requests_received_total{endpoint="tiny",namespace="ns"} 3.250000 12.500',
        "# EOF",
    ]


def test_promtool_writes_a_block_into_the_data_dir(tmp_path):
    from preheat_cluster import default_bin_dir

    promtool = default_bin_dir() / "promtool"
    if not promtool.exists():
        pytest.fail(f"needs {promtool}: run `make binaries` (bash cluster/build-binaries.sh prometheus)",
                    pytrace=False)
    data = tmp_path / "data"
    data.mkdir()
    samples = [(1_800_000_000.0 + 5 * i, float(i)) for i in range(100)]
    ulids = write_block(promtool, data, openmetrics({"namespace": "ns", "endpoint": "e"}, samples))
    assert ulids and all((data / u / "meta.json").exists() for u in ulids)
    meta = [json.loads((data / u / "meta.json").read_text()) for u in ulids]
    assert sum(m["stats"]["numSamples"] for m in meta) == 100
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".preheat-backfill-")]  # cleaned up
    (data / "wal").mkdir()  # dump reads a data dir as Prometheus leaves it
    dump = subprocess.run([str(promtool), "tsdb", "dump-openmetrics", str(data)], capture_output=True, text=True,
                          timeout=60)
    assert 'namespace="ns"' in dump.stdout and dump.stdout.count("preheat:requests_received_total") == 100


def test_reload_watch_predicts_the_next_reload_from_the_period():
    w = ReloadWatch("http://127.0.0.1:9")
    assert w.next_reload(100.0) is None
    w.reloads = [1000.0, 1060.5, 1121.0]
    assert w.period() == pytest.approx(60.5)
    assert w.next_reload(1125.0) == pytest.approx(1181.5)
    assert w.next_reload(1190.0) == pytest.approx(1242.0)


