"""`make bench-fine-grid`: the frontier's midpoints are added to the stored sweeps, from the same code."""

from __future__ import annotations

import json

import pytest
from preheat_lab import bench_fine_grid, bench_frontier
from preheat_lab.bench_sim import TRACES

from .tracegen import write_series

# Six hours at 10-minute windows: quiet spells between two busy hours.
RATES = [2.0] * 9 + [60.0, 80.0, 90.0, 80.0, 60.0, 50.0] + [3.0] * 6 + [70.0, 90.0, 60.0] + [1.0] * 12


@pytest.fixture()
def stored(tmp_path):
    """A traces folder with a small series under deepseek-r1's name and its frontier at 30 s stored."""
    traces, out = tmp_path / "traces", tmp_path / "out"
    traces.mkdir()
    write_series(traces / TRACES["deepseek-r1"], RATES)
    argv = ["--out-dir", str(out), "--traces-dir", str(traces), "--only", "deepseek-r1", "--colds", "30 s"]
    assert bench_frontier.main(argv) == 0
    return argv, out


def test_midpoints_join_the_stored_sweeps_and_can_only_lower_a_cost(stored):
    argv, out = stored
    assert bench_fine_grid.main(argv) == 0
    fine = json.loads((out / "frontier-fine-deepseek-r1-30s.json").read_text())
    coarse = json.loads((out / "frontier-deepseek-r1-30s.json").read_text())
    for f, res in fine["warm_cost_fractions"].items():
        before = coarse["warm_cost_fractions"][f]["policies"]
        for name in ("preheat", "hpa", "kpa", "keda", "aibrix"):
            us = [p["target_utilization"] for p in res["policies"][name]["points"]]
            assert us == sorted([*(p["target_utilization"] for p in before[name]["points"]),
                                 *bench_fine_grid.MIDPOINTS])
            for target, cost in res["policies"][name]["cost_at_slo"].items():
                was = before[name]["cost_at_slo"][target]
                assert was is None or (cost is not None and cost <= was)  # more points, never a dearer one
        assert res["policies"]["fixed"] == before["fixed"]
        assert res["rows_0.1"] == coarse["warm_cost_fractions"][f]["rows"]
    md = (out / "frontier-fine.md").read_text()
    assert md.count("| deepseek-r1 | 30 s |") == 2 * len(fine["warm_cost_fractions"])


def test_a_stored_sweep_from_other_code_is_refused(stored, capsys):
    argv, out = stored
    path = out / "frontier-deepseek-r1-30s.json"
    doc = json.loads(path.read_text())
    point = next(p for p in doc["warm_cost_fractions"]["1"]["policies"]["preheat"]["points"]
                 if p["target_utilization"] == 1.0)
    point["replica_seconds"] *= 1.01
    path.write_text(json.dumps(doc))
    assert bench_fine_grid.main(argv) == 2
    assert "rerun make bench-frontier first" in capsys.readouterr().err
    assert not (out / "frontier-fine-deepseek-r1-30s.json").exists()
