"""`make bench-heldout`: its variants are built as described and run what `preheat frontier` runs."""

from __future__ import annotations

import csv

from preheat_lab.bench_heldout import Variant, idle_copy, markdown, run_variant

from .tracegen import write_series

# Six hours at 10-minute windows: quiet spells between two busy hours.
RATES = [2.0] * 9 + [60.0, 80.0, 90.0, 80.0, 60.0, 50.0] + [3.0] * 6 + [70.0, 90.0, 60.0] + [1.0] * 12


def test_idle_copy_zeroes_the_quietest_two_fifths_and_keeps_the_rest(tmp_path):
    src = write_series(tmp_path / "d.csv", RATES)
    out = idle_copy(src, tmp_path / "idle.csv")
    with out.open() as f:
        got = [float(r["total_rate_rps"]) for r in csv.DictReader(f)]
    # 36 windows: the cut is the 15th quietest rate (2.0); windows below it go, the rest stay as they were
    cut = sorted(RATES)[int(0.4 * len(RATES))]
    assert got == [0.0 if r < cut else r for r in RATES]
    assert got.count(0.0) == 12  # the twelve 1.0 windows; the 2.0s tie at the cut and stay


def test_a_variant_s_preheat_settings_reach_preheat_and_only_preheat(tmp_path):
    path = idle_copy(write_series(tmp_path / "d.csv", RATES), tmp_path / "idle.csv")
    plain = run_variant(Variant("idle", "deepseek-r1", idle=True), path, "30")
    floor = run_variant(Variant("idle-floor", "deepseek-r1", idle=True, preheat=("min_replicas=4",)), path, "30")
    assert "--preheat min_replicas=4" in floor["command"]
    cost = {name: [p["replica_seconds"] for p in r["policies"]["preheat"]["points"]] for name, r in
            (("plain", plain), ("floor", floor))}
    # idle spells at four replicas instead of one: dearer at every U
    assert all(f > p for f, p in zip(cost["floor"], cost["plain"], strict=True))
    assert plain["policies"]["kpa"]["points"] == floor["policies"]["kpa"]["points"]
    table = markdown([plain, floor])
    assert table.count("| idle-floor | 30 s |") == 2 and table.count("| idle | 30 s |") == 2
