"""`preheat_lab.rerun_preheat`: Preheat's sweep rerun into a stored frontier file, the others kept."""

from __future__ import annotations

import json

import pytest
from preheat.sim import frontier
from preheat_lab.rerun_preheat import main, merge

from .tracegen import write_series

RATES = [2.0] * 6 + [40.0, 60.0, 80.0, 60.0, 30.0] + [3.0] * 6 + [70.0, 90.0] + [2.0] * 6


def test_preheat_is_rerun_and_the_other_sweeps_are_kept_with_where_they_ran(tmp_path):
    trace = write_series(tmp_path / "s.csv", RATES)
    args = ["--trace", str(trace), "--cold-start", "30", "--utilizations", "0.6,0.8,1.0"]
    stored_path = tmp_path / "f.json"
    assert frontier.main([*args, "--policy", "preheat,kpa", "--json", str(stored_path)]) == 0
    full = json.loads(stored_path.read_text())
    stored = json.loads(stored_path.read_text())
    stored["policies"]["kpa"]["points"][0]["replica_seconds"] = 1.0  # a mark: kept sweeps are not rerun
    stored["policies"]["preheat"]["points"] = []  # as if from an earlier policy
    stored_path.write_text(json.dumps(stored))
    assert main([str(stored_path), "--plot", str(tmp_path / "f.png"), "--", *args]) == 0
    doc = json.loads(stored_path.read_text())
    assert doc["policies"]["kpa"]["points"][0]["replica_seconds"] == 1.0
    assert doc["policies"]["preheat"]["points"] == full["policies"]["preheat"]["points"]
    assert doc["verdict"]["0.99"]["cost"]["preheat"] == full["verdict"]["0.99"]["cost"]["preheat"]
    assert doc["baselines_from"]["machine"] == full["machine"]
    assert "--policy preheat" in doc["baselines_from"]["note"]
    assert (tmp_path / "f.png").stat().st_size > 0


def test_another_workload_or_setting_is_refused(tmp_path):
    trace = write_series(tmp_path / "s.csv", RATES)
    stored_path = tmp_path / "f.json"
    frontier.main(["--trace", str(trace), "--cold-start", "30", "--utilizations", "0.8,1.0",
                   "--policy", "preheat,kpa", "--json", str(stored_path)])
    stored = json.loads(stored_path.read_text())
    with pytest.raises(ValueError, match="cold start"):
        merge(stored, stored | {"cold_start": "300 s"}, "x")
    with pytest.raises(ValueError, match="warm_cost_fraction"):
        merge(stored, stored | {"warm_cost_fraction": 0.4}, "x")
    with pytest.raises(SystemExit) as refused:  # --policy is the tool's own
        main([str(stored_path), "--", "--trace", str(trace), "--policy", "preheat"])
    assert refused.value.code == 2
