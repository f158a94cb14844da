"""`preheat_lab.rerun_preheat`: after a change to Preheat's policy, re-sweep Preheat alone into a stored
`preheat frontier --json` file and keep every other policy's sweep from it.

The baselines' and the oracle's sweeps do not run Preheat's policy, so rerunning them after a change to
it only costs CPU (on the 23-day traces most of an hour). This reruns `preheat frontier --policy
preheat` with the frontier arguments given after `--` (the same trace, cold start and settings the
stored file was made with: say them again), puts Preheat's new sweep in the stored file, recomputes
the verdict, records where the kept sweeps ran (`baselines_from`) and redraws the plot.

    python -m preheat_lab.rerun_preheat bench-results/frontier-X.json [--plot X.png] -- \
        --trace T.csv --cold-start C [other preheat frontier flags]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim import frontier as F
from preheat.sim.verdict import compare


def merge(stored: dict[str, Any], fresh: dict[str, Any], command: str) -> dict[str, Any]:
    """`stored` with Preheat's sweep from `fresh` (a `--policy preheat` run of the same workload), the
    verdict recomputed and `baselines_from` saying where the kept sweeps ran."""
    if stored.get("fleet") != fresh.get("fleet") or stored.get("cold_start") != fresh.get("cold_start"):
        raise ValueError(f"not the same workload: stored {stored.get('fleet')!r}, cold start "
                         f"{stored.get('cold_start')!r}; rerun {fresh.get('fleet')!r}, {fresh.get('cold_start')!r}")
    for key in ("warm_cost_fraction", "utilizations", "slo_targets", "slo_ms", "score_after_s"):
        if key in stored and stored[key] != fresh.get(key):
            raise ValueError(f"not the same settings: {key} {stored[key]!r} stored, {fresh.get(key)!r} rerun")
    policies = {**stored["policies"], "preheat": fresh["policies"]["preheat"]}
    kept = stored.get("baselines_from") or {"machine": stored.get("machine"), "cpu_s": stored.get("cpu_s")}
    note = (f"Preheat rerun alone ({command}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC); the other "
            "policies' sweeps kept from the stored file: they do not run Preheat's policy")
    return {**stored, "policies": policies,
            "verdict": compare(policies) if len(policies) > 1 else None,
            "machine": fresh.get("machine"), "preheat_cpu_s": fresh["policies"]["preheat"].get("cpu_s"),
            "baselines_from": {"note": note, "machine": kept.get("machine"), "cpu_s": kept.get("cpu_s"),
                               **({"earlier": kept["note"]} if "note" in kept else {})}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m preheat_lab.rerun_preheat STORED.json [--plot P.png] -- FRONTIER ARGS", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.rerun_preheat", description=__doc__.split("\n")[0])
    ap.add_argument("stored", type=Path)
    ap.add_argument("--plot", type=Path, help="redraw every policy's frontier here")
    args = ap.parse_args(argv[:cut])
    frontier_args = argv[cut + 1:]
    if "--policy" in frontier_args or "--json" in frontier_args:
        ap.error("give the frontier's workload arguments only: --policy preheat and --json are this tool's")
    stored = json.loads(args.stored.read_text())
    fresh = F.run(F.parser().parse_args([*frontier_args, "--policy", "preheat"]))
    doc = merge(stored, cli._json_safe(fresh), "preheat frontier " + " ".join(frontier_args) + " --policy preheat")
    args.stored.write_text(json.dumps(cli._json_safe(doc), indent=2))
    if args.plot:
        name = str(doc["trace"]).split(":")[0]
        F.plot_frontier(doc, args.plot, title=f"{name}, cold start {doc['cold_start']}, "
                        f"warm cost {doc.get('warm_cost_fraction', 1.0):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
