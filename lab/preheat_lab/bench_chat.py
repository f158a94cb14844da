"""`make bench-chat` (lab: `preheat_lab.bench_chat`): the frontier on one-hour chat traffic the shared
traces do not hold (`preheat_lab.chat_traffic`: mild, medium and bursty draws, two seeds each) at a
30 s, the measured and a 300 s cold start, every policy at its defaults, warm cost 1.

A generalization check, not a tuning target: the shared traces decided the policy; this asks what it
costs on traffic with no season and bursts shorter than a lead time. Writes the frontier JSON of every
cell (`chat/frontier-<preset>-s<seed>-<cold>.json`), a table of cost_at_slo per policy and Preheat's
margin against the cheapest baseline (`frontier-chat.md`) and a summary JSON with the machine.

    python -m preheat_lab.bench_chat --out-dir bench-results [--presets mild,medium] [--seeds 1,2] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim.frontier import SLO_TARGETS, UTILIZATIONS, machine, sweep
from preheat.sim.run import POLICY_NAMES, prepare_workload
from preheat.sim.traces import load_cold_start, load_trace
from preheat.sim.verdict import compare, margin_text

from preheat_lab.bench_frontier import COLDS
from preheat_lab.bench_sim import COLD_FILE, default_traces_dir
from preheat_lab.chat_traffic import PRESETS, write

SHOWN = ("preheat", "hpa", "keda", "kpa", "aibrix", "fixed", "oracle")


def colds(traces_dir: Path) -> dict[str, str]:
    """The frontier benchmark's cold starts (`bench_frontier.COLDS`); the measured one only where the shared
    folder has its distribution."""
    measured = traces_dir / COLD_FILE
    return {k: v or str(measured) for k, v in COLDS.items() if v or measured.exists()}


def run_cell(trace: Path, cold_arg: str, jobs: int) -> dict[str, Any]:
    """Every policy's frontier (the oracle the reference) on one drawn trace at one cold start."""
    settings = cli.settings_from(cli.parser().parse_args(["--trace", str(trace), "--cold-start", cold_arg]))
    w = prepare_workload(load_trace(str(trace)), settings)
    return sweep(w, load_cold_start(cold_arg), settings, list(POLICY_NAMES), UTILIZATIONS, SLO_TARGETS, jobs=jobs)


def rows(cell: dict[str, Any]) -> list[str]:
    """The table's rows for one cell: cost per policy (replica-hours) and Preheat's margin, per SLO."""
    out = []
    for target, row in cell["verdict"].items():
        costs = " | ".join("—" if row["cost"].get(n) is None else f"{row['cost'][n] / 3600:.1f}" for n in SHOWN)
        out.append(f"| {cell['preset']} | {cell['seed']} | {cell['cold_key']} | {100 * float(target):g} % | {costs} "
                   f"| {margin_text(row)} | {_ratio(row)} |")
    return out


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the sweeps' worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _ratio(row: dict[str, Any]) -> str:
    r = row["preheat_vs_oracle"]
    return "—" if r is None else f"{r:.2f}x"


def markdown(cells: list[dict[str, Any]]) -> str:
    head = ("| traffic | seed | cold start | SLO | " + " | ".join(SHOWN) + " | Preheat vs the cheapest baseline | Preheat / oracle |\n"
            "|---|---|---|---|" + "---:|" * len(SHOWN) + "---|---:|")
    return "\n".join([head, *(r for c in cells for r in rows(c))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.bench_chat", description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path, default=Path("bench-results"))
    ap.add_argument("--traces-dir", type=Path, default=None, help="where the measured cold starts are")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        ap.error(f"unknown preset(s) {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    traces_dir = Path(args.traces_dir or default_traces_dir())
    work = args.out_dir / "chat"
    work.mkdir(parents=True, exist_ok=True)
    started, wall, cells = _cpu_s(), time.monotonic(), []
    for preset in presets:
        for seed in seeds:
            trace = work / f"{preset}-s{seed}.csv"
            write(trace, PRESETS[preset], seed)
            for cold_key, cold_arg in colds(traces_dir).items():
                policies = run_cell(trace, cold_arg, args.jobs)
                cell = {"preset": preset, "seed": seed, "cold_key": cold_key, "policies": policies}
                name = f"frontier-{preset}-s{seed}-{cold_key.replace(' ', '')}.json"
                (work / name).write_text(json.dumps({**cell, "machine": machine()}, indent=1))
                cell["verdict"] = compare(policies)
                cells.append(cell)
                print("\n".join(rows(cell)), flush=True)
            trace.unlink()  # drawn again from its seed; the JSON is the result
    table = markdown(cells)
    (args.out_dir / "frontier-chat.md").write_text(table)
    summary = {"cells": [{k: c[k] for k in ("preset", "seed", "cold_key", "verdict")} for c in cells],
               "cpu_s": _cpu_s() - started, "wall_s": time.monotonic() - wall, "machine": machine()}
    (args.out_dir / "frontier-chat.json").write_text(json.dumps(summary, indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
