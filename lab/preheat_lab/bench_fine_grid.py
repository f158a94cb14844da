"""`make bench-fine-grid` (lab: `preheat_lab.bench_fine_grid`): the frontier table's verdicts on a grid of U
twice as fine, measured instead of interpolated.

The frontier table (`make bench-frontier`) sweeps every autoscaler's target utilization U over 0.3, 0.4,
... 1.0, as issue 15 asks, and reports each verdict twice: on that grid, where a point landing just past
the SLO target looks cheap and one just short looks dear, and between grid points, where the cost is
interpolated linearly. This adds the midpoints (0.35, 0.45, ... 0.95) of every causal policy (Preheat at
each warm cost fraction, the HPA, KEDA, Knative's KPA, AIBrix) to the stored sweeps and reports the
verdict on the finer grid: what the interpolation estimates, measured. The fixed fleet (its knob is the
fleet's size, every size already swept) and the oracle (the reference, already on a 0.05 grid) are kept.

Before adding anything it reruns each causal policy's U = 1 point and checks it against the stored one, so
the midpoints and the stored points come from the same code (a stale file is an error: rerun
`make bench-frontier` first).

    python -m preheat_lab.bench_fine_grid --out-dir bench-results [--only m-small] [--colds 30 s,300 s]

Writes `frontier-fine-<trace>-<cold>.json` per row (runs may be split across processes) and the table of
every such file in the folder, `frontier-fine.md`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim.frontier import SLO_TARGETS, cost_at_slo, machine, sweep
from preheat.sim.run import prepare_workload
from preheat.sim.traces import load_cold_start, load_trace
from preheat.sim.verdict import compare, margin_text

from preheat_lab.bench_frontier import COLDS, count_cheapest, frontier_stem, rows_in
from preheat_lab.bench_sim import COLD_FILE, TRACES, default_traces_dir

MIDPOINTS = tuple(round(0.35 + 0.1 * i, 2) for i in range(7))  # 0.35 ... 0.95
CAUSAL = ("hpa", "kpa", "keda", "aibrix")
CHECK_U = 1.0


class StaleSweeps(RuntimeError):
    """The stored frontier was made by other code than this checkout's."""


def check_point(stored: dict[str, Any], fresh: dict[str, Any], what: str) -> None:
    """The stored point at CHECK_U and the fresh one agree (the same workload, seed and code)."""
    old = next(p for p in stored["points"] if p["target_utilization"] == CHECK_U)
    new = fresh["points"][0]
    for key in ("slo_attainment", "replica_seconds"):
        if not math.isclose(old[key], new[key], rel_tol=1e-9, abs_tol=1e-9):
            raise StaleSweeps(f"{what} at U {CHECK_U:g}: stored {key} {old[key]!r}, rerun gives "
                              f"{new[key]!r}; rerun make bench-frontier first")


def finer(stored: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """A policy's stored sweep with the midpoints added, its cost at each SLO target recomputed."""
    points = sorted([*stored["points"], *added["points"]], key=lambda p: p["target_utilization"])
    return {"points": points, "cost_at_slo": cost_at_slo(points, SLO_TARGETS),
            "cpu_s": stored.get("cpu_s", 0.0) + added["cpu_s"]}


def run_row(key: str, path: Path, cold_key: str, cold_arg: str, out_dir: Path) -> dict[str, Any]:
    """One (trace, cold start): the midpoints of every causal policy, at every warm cost fraction stored."""
    doc = json.loads((out_dir / f"{frontier_stem(key, cold_key)}.json").read_text())
    args = cli.parser().parse_args(["--trace", str(path), "--cold-start", cold_arg])
    settings = cli.settings_from(args)
    w = prepare_workload(load_trace(str(path)), settings)
    cold = load_cold_start(cold_arg)
    started = time.process_time()
    print(f"\n== {key}, cold start {cold_key}", flush=True)
    first = next(iter(doc["warm_cost_fractions"].values()))["policies"]
    base = {}
    for name in CAUSAL:
        check_point(first[name], sweep(w, cold, settings, [name], (CHECK_U,), SLO_TARGETS)[name], name)
        base[name] = finer(first[name], sweep(w, cold, settings, [name], MIDPOINTS, SLO_TARGETS)[name])
    by_fraction = {}
    for f, res in doc["warm_cost_fractions"].items():
        s = replace(settings, warm_cost_fraction=float(f))
        stored = res["policies"]["preheat"]
        again = sweep(w, cold, s, ["preheat"], (CHECK_U,), SLO_TARGETS)["preheat"]
        check_point(stored, again, f"preheat at {f}")
        pre = finer(stored, sweep(w, cold, s, ["preheat"], MIDPOINTS, SLO_TARGETS)["preheat"])
        kept = {n: res["policies"][n] for n in ("fixed", "oracle")}
        policies = {"preheat": pre, **base, **kept}
        by_fraction[f] = {"policies": policies, "rows": compare(policies), "rows_0.1": res["rows"]}
    return {"trace_key": key, "cold_key": cold_key, "cold_start": cold.label, "utilizations_added": MIDPOINTS,
            "warm_cost_fractions": by_fraction, "cpu_s": time.process_time() - started, "machine": machine()}


def table(rows: list[dict[str, Any]]) -> str:
    """trace | cold start | warm cost | SLO | Preheat against the cheapest baseline: on the 0.1 grid, on the
    0.05 grid, interpolated between the 0.1 grid's points."""
    out = ["| trace | cold start | warm cost | SLO | 0.1 grid | 0.05 grid | between 0.1 grid points |",
           "|---|---|---|---|---|---|---|"]
    for doc in rows:
        for f, res in doc["warm_cost_fractions"].items():
            for target, row in res["rows"].items():
                coarse = res["rows_0.1"][target]
                out.append(f"| {doc['trace_key']} | {doc['cold_key']} | {f} | {100 * float(target):g} % | "
                           f"{margin_text(coarse)} | {margin_text(row)} | "
                           f"{margin_text(coarse['interpolated'])} |")
    return "\n".join([*out, "", tally(rows)])


def tally(rows: list[dict[str, Any]]) -> str:
    """How many rows Preheat wins on each grid (a row counts where some baseline reaches its SLO)."""
    coarse = [r["rows_0.1"][t] for d in rows for r in d["warm_cost_fractions"].values() for t in r["rows"]]
    fine = [r["rows"][t] for d in rows for r in d["warm_cost_fractions"].values() for t in r["rows"]]
    n, grid, interp = count_cheapest(coarse)
    n_fine, fine_grid, _ = count_cheapest(fine)
    return (f"Preheat is the cheapest in {grid} of {n} rows on the 0.1 grid, {fine_grid} of {n_fine} on the "
            f"0.05 grid and {interp} of {n} between the 0.1 grid's points.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.bench_fine_grid",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="bench-results")
    ap.add_argument("--traces-dir", default=default_traces_dir())
    ap.add_argument("--only", help="comma list of trace keys")
    ap.add_argument("--colds", default=",".join(COLDS),
                    help="comma list of cold-start keys: 30 s, measured, 300 s")
    args = ap.parse_args(argv)
    tdir, out_dir = Path(args.traces_dir), Path(args.out_dir)
    for key in args.only.split(",") if args.only else list(TRACES):
        path = tdir / TRACES[key]
        if not path.exists():
            print(f"skipping {key}: {path} not found", file=sys.stderr)
            continue
        for cold_key in (c.strip() for c in args.colds.split(",")):
            try:
                doc = run_row(key, path, cold_key, COLDS[cold_key] or str(tdir / COLD_FILE), out_dir)
            except StaleSweeps as e:
                print(f"{key} {cold_key}: {e}", file=sys.stderr)
                return 2
            stem = frontier_stem(key, cold_key).replace("frontier-", "frontier-fine-", 1)
            (out_dir / f"{stem}.json").write_text(json.dumps(cli._json_safe(doc), indent=2))
    print("\n" + write_table(out_dir))
    return 0


def write_table(out_dir: Path) -> str:
    """frontier-fine.md from every frontier-fine-*.json in `out_dir`, in the frontier table's order."""
    md = table(rows_in(out_dir, "frontier-fine-*.json"))
    (out_dir / "frontier-fine.md").write_text(md + "\n")
    return md


if __name__ == "__main__":
    sys.exit(main())
