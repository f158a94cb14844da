"""`make bench-heldout`: its variants are built as described and run what `preheat frontier` runs."""

from __future__ import annotations

import csv

from preheat_lab.bench_heldout import IDLE_BELOW, Variant, idle_copy, markdown, run_variant

from .tracegen import write_series

# Six hours at 10-minute windows: quiet spells between two busy hours.
RATES = [2.0] * 9 + [60.0, 80.0, 90.0, 80.0, 60.0, 50.0] + [3.0] * 6 + [70.0, 90.0, 60.0] + [1.0] * 12


def test_idle_copy_zeroes_the_windows_below_half_the_peak_and_keeps_the_rest(tmp_path):
    src = write_series(tmp_path / "d.csv", RATES)
    out = idle_copy(src, tmp_path / "idle.csv")
    with out.open() as f:
        got = [float(r["total_rate_rps"]) for r in csv.DictReader(f)]
    want = [0.0 if r < IDLE_BELOW * max(RATES) else r for r in RATES]
    assert got == want
    assert 0 < got.count(0.0) < len(got)


def test_a_variant_s_preheat_settings_reach_preheat_and_only_preheat(tmp_path):
    path = idle_copy(write_series(tmp_path / "d.csv", RATES), tmp_path / "idle.csv")
    plain = run_variant(Variant("idle", "deepseek-r1", idle=True), path, "30")
    to_zero = run_variant(Variant("idle-stz", "deepseek-r1", idle=True,
                                  preheat=("min_replicas=0", "scale_to_zero=true")), path, "30")
    assert "--preheat min_replicas=0 --preheat scale_to_zero=true" in to_zero["command"]
    cost = {name: [p["replica_seconds"] for p in r["policies"]["preheat"]["points"]] for name, r in
            (("plain", plain), ("to_zero", to_zero))}
    # idle spells at zero replicas instead of one: cheaper at every U
    assert all(z < p for z, p in zip(cost["to_zero"], cost["plain"], strict=True))
    assert plain["policies"]["kpa"]["points"] == to_zero["policies"]["kpa"]["points"]
    table = markdown([plain, to_zero])
    assert table.count("| idle-stz | 30 s |") == 2 and table.count("| idle | 30 s |") == 2
