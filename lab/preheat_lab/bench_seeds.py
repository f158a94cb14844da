"""`make bench-seeds` (lab: `preheat_lab.bench_seeds`): does the frontier's verdict survive other draws
of the arrivals?

The ServeGen series carry a count per 10-minute window and the inter-arrival CV inside it; the simulator
draws the arrivals inside each window (Gamma step counts, `sim/bursts.py`) from `--seed`. The frontier
table (`bench_frontier`) is one draw, seed 0, and several of its rows are decided by less than 1 %. This
reruns every autoscaler's frontier (the oracle left out: it is the reference, not a competitor) on the
same traces with other seeds, at warm cost 1 and the fixed cold starts, and reports per seed Preheat's
cost_at_slo against the best baseline's, on the grid and with U interpolated. Seed 0 is read from the
stored frontier JSON (`bench-results/frontier-<trace>-<cold>.json`), so run `bench_frontier` first.

    python -m preheat_lab.bench_seeds --out bench-results/frontier_seeds.json [--seeds 1,2] [--only m-small]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim.frontier import SLO_TARGETS, UTILIZATIONS, machine, sweep
from preheat.sim.run import POLICY_NAMES, prepare_workload
from preheat.sim.traces import load_cold_start, load_trace
from preheat.sim.verdict import compare, margin_text

from preheat_lab.bench_frontier import count_cheapest, frontier_stem
from preheat_lab.bench_sim import TRACES, default_traces_dir

SERIES = ("deepseek-r1", "m-small", "m-mid")  # the traces whose arrivals the seed draws
COLDS = {"30 s": "30", "300 s": "300"}  # fixed cold starts: the seed moves the arrivals only
COMPETITORS = [n for n in POLICY_NAMES if n != "oracle"]


def stored_seed0(out_dir: Path, key: str, cold_key: str) -> dict[str, Any] | None:
    """Seed 0's policies at warm cost 1 from the frontier benchmark's JSON, the oracle left out."""
    p = out_dir / f"{frontier_stem(key, cold_key)}.json"
    if not p.exists():
        return None
    policies = json.loads(p.read_text())["warm_cost_fractions"]["1"]["policies"]
    return {n: v for n, v in policies.items() if n != "oracle"}


def run_seed(path: Path, cold_arg: str, seed: int) -> dict[str, Any]:
    """Every competitor's frontier on the trace with the arrivals drawn from `seed`."""
    argv = ["--trace", str(path), "--cold-start", cold_arg, "--seed", str(seed)]
    settings = cli.settings_from(cli.parser().parse_args(argv))
    w = prepare_workload(load_trace(str(path), seed=seed), settings)
    return sweep(w, load_cold_start(cold_arg), settings, COMPETITORS, UTILIZATIONS, SLO_TARGETS)


def verdict(policies: dict[str, Any]) -> dict[str, Any]:
    """Per SLO target: Preheat's cost, the best baseline and the margin, on the grid and (`interpolated`)
    with U interpolated: `bench_frontier.rows` without the other policies' costs."""
    out = {}
    for target, row in compare(policies).items():
        best = row["best_baseline"]
        out[target] = {
            "preheat": row["cost"].get("preheat"), "best_baseline": best,
            "best_cost": row["cost"].get(best) if best else None, "margin_vs_best": row["margin_vs_best"],
            "interpolated": {k: row["interpolated"][k] for k in ("best_baseline", "margin_vs_best")},
        }
    return out


def markdown(doc: dict[str, Any]) -> str:
    seeds = doc["seeds"]
    head = "| trace | cold start | SLO | " + " | ".join(f"seed {s}: grid / interpolated" for s in seeds) + " |"
    lines = [head, "|" + "---|" * 3 + "---|" * len(seeds)]
    for cell in doc["cells"]:
        for target in (f"{t:g}" for t in SLO_TARGETS):
            parts = []
            for s in seeds:
                v = cell["by_seed"].get(str(s), {}).get(target)
                parts.append("—" if v is None else f"{margin_text(v)} / {margin_text(v['interpolated'])}")
            lines.append(f"| {cell['trace_key']} | {cell['cold_key']} | {100 * float(target):g} % | "
                         + " | ".join(parts) + " |")
    return "\n".join(lines)


def tally(doc: dict[str, Any]) -> dict[str, Any]:
    """How many (trace, cold start, SLO, seed) cells with a baseline reaching the SLO Preheat is the
    cheapest in, on the grid and interpolated."""
    n, grid, interp = count_cheapest(
        v for cell in doc["cells"] for by_target in cell["by_seed"].values() for v in by_target.values())
    return {"cells": n, "cheapest_on_grid": grid, "cheapest_interpolated": interp}


def _job(job: tuple[str, str, str, str, int]) -> tuple[str, str, int, dict[str, Any], float]:
    key, path, cold_key, cold_arg, seed = job
    started = time.process_time()
    result = verdict(run_seed(Path(path), cold_arg, seed))
    print(f"  done: {key}, cold start {cold_key}, seed {seed}", flush=True)
    return key, cold_key, seed, result, time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.bench_seeds", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench-results/frontier_seeds.json")
    ap.add_argument("--traces-dir", default=default_traces_dir())
    ap.add_argument("--seeds", default="1,2", help="comma list of seeds to run besides the stored seed 0")
    ap.add_argument("--only", help="comma list of trace keys (default: the ServeGen series)")
    ap.add_argument("--jobs", type=int, default=1, help="processes (one sweep each; default 1)")
    args = ap.parse_args(argv)
    out, tdir = Path(args.out), Path(args.traces_dir)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    keys = args.only.split(",") if args.only else list(SERIES)
    unknown = [k for k in keys if k not in SERIES]
    if unknown:
        ap.error(f"--only: {', '.join(unknown)} is not one of the series whose arrivals a seed draws: {', '.join(SERIES)}")
    for k in [k for k in keys if not (tdir / TRACES[k]).exists()]:
        print(f"skipping {k}: {tdir / TRACES[k]} not found", file=sys.stderr)
        keys.remove(k)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"cells": []}
    cells = {(c["trace_key"], c["cold_key"]): c for c in doc["cells"]}
    for key in keys:
        for cold_key in COLDS:
            cell = cells.setdefault((key, cold_key), {"trace_key": key, "cold_key": cold_key, "by_seed": {}})
            seed0 = stored_seed0(out.parent, key, cold_key)
            if seed0 is not None:
                cell["by_seed"]["0"] = verdict(seed0)
    jobs = [(k, str(tdir / TRACES[k]), c, a, s) for k in keys for c, a in COLDS.items() for s in seeds]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for key, cold_key, seed, result, cpu in pool.map(_job, jobs):
            cells[(key, cold_key)]["by_seed"][str(seed)] = result
            cells[(key, cold_key)].setdefault("cpu_s", {})[str(seed)] = cpu
    doc["cells"] = sorted(cells.values(), key=lambda c: (list(TRACES).index(c["trace_key"]), c["cold_key"]))
    doc["seeds"] = sorted({int(s) for c in doc["cells"] for s in c["by_seed"]})
    doc |= {"tally": tally(doc), "machine": machine(),
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "command": "python -m preheat_lab.bench_seeds " + " ".join(argv if argv is not None else sys.argv[1:])}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cli._json_safe(doc), indent=2))
    out.with_suffix(".md").write_text(markdown(doc) + "\n")
    print("\n" + markdown(doc) + f"\n\n{doc['tally']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
