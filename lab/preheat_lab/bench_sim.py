"""`make bench-sim`: every trace in the shared folder x every policy x (30 s, measured) cold starts.

Runs exactly what `preheat simulate --policy all` runs, writes one JSON with every result, the
Must-show checks (Preheat's SLO attainment and replica-seconds against each baseline), the wall time
of each run (the 14-day series and the one-hour per-request traces), plots, and a Markdown table.

    python -m preheat_lab.bench_sim --out bench-results/simulate.json [--traces-dir DIR] [--only KEYS]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim.traces import load_cold_start
from preheat_server.hardware import machine_record

TRACES = {
    "azure-code": "azure_llm_2023_code.csv",
    "mooncake": "mooncake_conversation.jsonl",
    "m-small": "servegen_m-small_10min.csv",
    "m-mid": "servegen_m-mid_10min.csv",
    "deepseek-r1": "servegen_deepseek-r1_10min.csv",
}
COLD_FILE = "alibaba_cold_starts_ms.csv"
# Bursty per-request traces get the always-on frontier: fixed fleets of these sizes.
FRONTIER_TRACES = ("azure-code",)
FRONTIER_SIZES = range(6, 25, 2)


def default_traces_dir() -> str:
    """$PREHEAT_TRACES, else `../shared/traces` beside the checkout (the README's commands run from the
    repository root)."""
    return os.environ.get("PREHEAT_TRACES", "../shared/traces")


def checks(policies: dict[str, dict[str, Any]], cold_s: float) -> dict[str, Any]:
    """The issue's targets for Preheat on one run (`cold_s`: the cold start to beat at the daily ramp)."""
    p = policies.get("preheat")
    if p is None:
        return {}
    others = {k: v for k, v in policies.items() if k not in ("preheat", "oracle", "fixed")}
    out: dict[str, Any] = {
        "attainment_ge_99": bool(p["slo_attainment"] >= 0.99),
        "attainment_ge_baselines": bool(all(p["slo_attainment"] >= v["slo_attainment"] - 1e-12 for v in others.values())),
    }
    if "oracle" in policies:
        ratio = p["replica_seconds"] / policies["oracle"]["replica_seconds"]
        out["replica_seconds_vs_oracle"] = float(ratio)
        out["replica_seconds_le_1_25_oracle"] = bool(ratio <= 1.25)
    leads = p.get("ramp_lead_s")
    if leads:
        out["ramp_lead_median_s"] = float(statistics.median(leads))
        out["ramp_cold_start_s"] = cold_s
        out["ramp_days_capacity_first_by_cold_start"] = f"{sum(x >= cold_s for x in leads)}/{len(leads)}"
    if "fixed" in policies:
        out["replica_seconds_lt_fixed"] = bool(p["replica_seconds"] < policies["fixed"]["replica_seconds"])
    return out


def fixed_frontier(path: Path, sizes: range) -> list[dict[str, Any]]:
    """SLO attainment and replica-hours of always-on fleets of n replicas on a per-request trace.

    An autoscaler without foresight cannot beat the cheapest always-on fleet that meets the SLO on
    traffic whose bursts come without warning; this frontier says what that fleet costs.
    """
    from preheat.sim.baselines import Fixed
    from preheat.sim.run import SimSettings, prepare_workload, simulate
    from preheat.sim.traces import RequestTrace, load_cold_start, load_trace

    trace = load_trace(str(path))
    if not isinstance(trace, RequestTrace):
        return []
    settings = SimSettings()
    workload = prepare_workload(trace, settings)
    cold = load_cold_start("30")
    out = []
    for n in sizes:
        r = simulate(workload, Fixed(n), cold, settings)
        out.append({"replicas": n, "slo_attainment": r.slo_attainment, "replica_seconds": float(r.replica_seconds)})
    return out


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| trace | cold start | policy | SLO attainment | p99 TTFT (ms) | replica-hours | × oracle | scale actions | cold starts | promotions |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        oracle = run["policies"].get("oracle", {}).get("replica_seconds")
        for name, r in run["policies"].items():
            p99 = "∞" if r["p99_latency_ms"] is None else f"{r['p99_latency_ms']:.0f}"
            ratio = f"{r['replica_seconds'] / oracle:.2f}" if oracle else ""
            bold = "**" if name == "preheat" else ""
            lines.append(
                f"| {run['trace_key']} | {run['cold_key']} | {bold}{name}{bold} | {100 * r['slo_attainment']:.2f} % | {p99} "
                f"| {r['replica_seconds'] / 3600:.1f} | {ratio} | {r['scale_actions']} | {r['cold_starts']} | {r['promotions']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.bench_sim", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench-results/simulate.json")
    ap.add_argument("--traces-dir", default=default_traces_dir())
    ap.add_argument("--only", help="comma list of trace keys")
    ap.add_argument("--policy", default="all")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    tdir = Path(args.traces_dir)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = args.only.split(",") if args.only else list(TRACES)
    colds = {"30 s": "30", "measured": str(tdir / COLD_FILE)}
    runs: list[dict[str, Any]] = []
    frontier: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    for key in keys:
        path = tdir / TRACES[key]
        if not path.exists():
            print(f"skipping {key}: {path} not found", file=sys.stderr)
            continue
        for cold_key, cold in colds.items():
            stem = f"{out.stem}-{key}-{'30s' if cold_key == '30 s' else 'measured'}"
            argv_sim = ["--trace", str(path), "--policy", args.policy, "--cold-start", cold]
            if not args.no_plots:
                argv_sim += ["--plot", str(out.parent / f"{stem}.png")]
            print(f"\n== {key}, cold start {cold_key}: preheat simulate {' '.join(argv_sim)}", flush=True)
            t0 = time.perf_counter()
            result = cli.run(cli.parser().parse_args(argv_sim))
            result.update(trace_key=key, cold_key=cold_key, command="preheat simulate " + " ".join(argv_sim),
                          wall_s_all_policies=time.perf_counter() - t0, checks=checks(result["policies"], load_cold_start(cold).quantile(0.95)))
            print(json.dumps(result["checks"]))
            runs.append(result)
        if key in FRONTIER_TRACES:
            frontier[key] = fixed_frontier(path, FRONTIER_SIZES)
            print(f"always-on fleets on {key}: " + ", ".join(
                f"{f['replicas']}: {100 * f['slo_attainment']:.2f} % / {f['replica_seconds'] / 3600:.1f} h" for f in frontier[key]))
    timing = {
        f"{r['trace_key']} ({r['cold_key']})": {name: {"wall_s": p["wall_s"], "cpu_s": p["cpu_s"]} for name, p in r["policies"].items()}
        for r in runs
    }
    doc = {
        "machine": {**machine_record(), "python": platform.python_version(), "platform": platform.platform()},
        "note": "cpu_s is the CPU time of one policy's run on one core (wall_s is inflated on a shared machine); the 14-day series are m-small and m-mid, the one-hour "
        "per-request traces azure-code and mooncake",
        "total_wall_s": time.perf_counter() - started,
        "timing_s": timing,
        "runs": runs,
        "always_on_frontier": frontier,
    }
    out.write_text(json.dumps(doc, indent=2))
    table = markdown(runs)
    out.with_suffix(".md").write_text(table + "\n")
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
