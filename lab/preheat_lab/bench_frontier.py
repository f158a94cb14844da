"""`make bench-frontier` (lab: `preheat_lab.bench_frontier`): the cost-SLO frontier of every policy on every trace in the shared folder x
cold start {30 s, measured, 300 s} x warm cost fraction {1.0, the measured CPU fraction 0.414}.

Runs what `preheat frontier` runs, on one prepared workload per (trace, cold start): the baselines
have no warm pool, so their frontier is the same at every warm cost fraction and runs once; Preheat
runs at each fraction (its policy reads it). Writes one JSON per (trace, cold start) with both
fractions, one PNG per (trace, cold start), the README table (Markdown) with the margins and its verdicts
on one screen (`frontier-glance.md`: trace and SLO x cold start).

    python -m preheat_lab.bench_frontier --out-dir bench-results [--only m-small] [--colds 30,300] [--preheat-only]

`--preheat-only` reruns Preheat's sweeps alone and keeps the baselines' (and the oracle's) points from the
stored JSON (recorded under `baselines_from`): after a change to Preheat's policy, they have not changed.

The CPU fraction is measured (issue 17, `bench-results/warm-resize-real-node.json`): on a real node
(kubelet v1.37.2, containerd 2.4.2) the operator resizes a Ready preheat-server pod in place from its
serving size, 1 CPU / 4 GiB, to the warm size, 100m / 4 GiB (the model stays loaded), and back on
promotion; priced as cores + GiB x 0.134 (GCP on-demand N2: $0.004237 per GiB-hour / $0.031611 per
vCPU-hour), (0.1 + 4 x 0.134) / (1 + 4 x 0.134) = 0.414. Earlier tables used 0.37, a priced stand-in
for a 4 vCPU / 16 GiB replica before the resize existed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim.frontier import SLO_TARGETS, UTILIZATIONS, machine, plot_frontier, setting_text, sweep
from preheat.sim.run import POLICY_NAMES, prepare_workload
from preheat.sim.traces import load_cold_start, load_trace
from preheat.sim.verdict import compare, margin_text

from preheat_lab.bench_sim import COLD_FILE, TRACES, default_traces_dir

# Measured on a real node (bench-results/warm-resize-real-node.json, warm_cost_fraction_measured).
CPU_WARM_FRACTION = 0.414
WARM_FRACTIONS = (1.0, CPU_WARM_FRACTION)
COLDS = {"30 s": "30", "measured": None, "300 s": "300"}


def frontier_stem(key: str, cold_key: str) -> str:
    """The file name, without suffix, of this (trace, cold start)'s frontier JSON and charts."""
    return f"frontier-{key}-{cold_key.replace(' ', '')}"


def stored_sweeps(out_dir: Path, key: str, cold_key: str) -> dict[str, Any] | None:
    """This (trace, cold start)'s stored JSON, read once, or None: the baselines' sweeps and the oracle's
    (they do not read Preheat's policy or the warm cost fraction, so a Preheat-only rerun keeps them),
    Preheat's per warm cost fraction (an oracle-only rerun keeps those) and where they came from."""
    p = out_dir / f"{frontier_stem(key, cold_key)}.json"
    if not p.exists():
        return None
    doc = json.loads(p.read_text())
    first = next(iter(doc["warm_cost_fractions"].values()))["policies"]
    return {"policies": {n: v for n, v in first.items() if n != "preheat"},
            "preheat": {f: res["policies"]["preheat"] for f, res in doc["warm_cost_fractions"].items()},
            "machine": doc.get("machine"), "cpu_s": doc.get("cpu_s"), "earlier": doc.get("baselines_from")}


def run_one(key: str, path: Path, cold_key: str, cold_arg: str, out_dir: Path,
            preheat_only: bool = False, oracle_only: bool = False) -> dict[str, Any]:
    argv = ["--trace", str(path), "--cold-start", cold_arg]
    args = cli.parser().parse_args(argv)
    settings = cli.settings_from(args)
    trace = load_trace(str(path))
    cold = load_cold_start(cold_arg)
    w = prepare_workload(trace, settings)
    started = time.process_time()
    print(f"\n== {key}, cold start {cold_key} ({cold.label})", flush=True)
    baselines = [n for n in POLICY_NAMES if n != "preheat"]
    by_fraction: dict[str, Any] = {}
    stored = stored_sweeps(out_dir, key, cold_key) if preheat_only or oracle_only else None
    kept_preheat = stored["preheat"] if oracle_only and stored is not None else None
    if (preheat_only or oracle_only) and stored is None:
        print(f"  no stored sweeps for {key} {cold_key}: running them all", flush=True)
    if stored is None:
        base = sweep(w, cold, settings, baselines, UTILIZATIONS, SLO_TARGETS)
    elif oracle_only:  # the oracle's reference changed; the causal policies' sweeps do not read it
        base = {**stored["policies"], **sweep(w, cold, settings, ["oracle"], UTILIZATIONS, SLO_TARGETS)}
    else:
        base = stored["policies"]
    for f in WARM_FRACTIONS:
        print(f"  warm cost fraction {f:g}:", flush=True)
        if kept_preheat is not None and f"{f:g}" in kept_preheat:
            pre = {"preheat": kept_preheat[f"{f:g}"]}
        else:
            pre = sweep(w, cold, replace(settings, warm_cost_fraction=f), ["preheat"], UTILIZATIONS, SLO_TARGETS)
        by_fraction[f"{f:g}"] = {"policies": {**pre, **base}, "rows": compare(pre | base)}
    doc = {
        "trace_key": key, "trace": trace.describe(), "fleet": w.describe(), "cold_key": cold_key,
        "cold_start": cold.label, "slo_ms": settings.slo_ms, "bursty": settings.bursty,
        "utilizations": list(UTILIZATIONS), "slo_targets": list(SLO_TARGETS),
        "command": "preheat frontier " + " ".join(argv) + " --warm-cost-fraction F",
        "warm_cost_fractions": by_fraction,
        "cpu_warm_fraction_source": "measured: bench-results/warm-resize-real-node.json (1 CPU / 4 GiB serving, "
                                    "100m / 4 GiB warm, cores + GiB x 0.134)",
        "cpu_s": time.process_time() - started, "machine": machine(),
    }
    if stored is not None:
        kept = ("Preheat's and the baselines' sweeps kept from the previous run of this file (--oracle-only): "
                "only the oracle, the reference, was rerun" if oracle_only else
                "baseline and oracle sweeps kept from the previous run of this file (--preheat-only): they do "
                "not depend on Preheat's policy")
        doc["baselines_from"] = {"note": kept, "machine": stored["machine"], "cpu_s": stored["cpu_s"],
                                 **({"earlier": stored["earlier"]} if stored.get("earlier") else {})}
    stem = frontier_stem(key, cold_key)
    (out_dir / f"{stem}.json").write_text(json.dumps(cli._json_safe(doc), indent=2))
    for f, res in by_fraction.items():
        plot_frontier({"policies": res["policies"], "slo_targets": list(SLO_TARGETS), "slo_ms": settings.slo_ms,
                       "trace": trace.describe()}, out_dir / f"{stem}-warm{f}.png",
                      title=f"{key}, cold start {cold.label}, warm cost {f}")
    return doc


def burst_check(path: Path, out: Path, rate_scale: float = 0.005, start_window: int = 492, windows: int = 36) -> dict:
    """The fluid model's bursty arrivals against the per-request engine on a slice of a series: the
    same windows replayed as a Gamma renewal process (single requests, the recorded CV) and as Gamma
    step counts; fixed fleets of several sizes in both engines (SLO attainment side by side)."""
    import numpy as np
    from preheat.sim.baselines import Fixed
    from preheat.sim.bursts import renewal_arrivals
    from preheat.sim.run import SimSettings, simulate
    from preheat.sim.traces import SeriesTrace

    tr = load_trace(str(path), rate_scale=rate_scale)
    sl = slice(start_window, start_window + windows)
    part = SeriesTrace(tr.name, tr.t_s[sl] - tr.t_s[sl][0], tr.rate_rps[sl], tr.window_s, tr.source_format,
                       rate_scale, None if tr.cv is None else tr.cv[sl])
    req = renewal_arrivals(part, 0.0, part.duration_s, seed=1)
    cold = load_cold_start("30")
    s = SimSettings(capacity_rps=1.0, slots=1, service_s=1.0, first_token_s=0.2)
    fluid, per_request = prepare_workload(part, s), prepare_workload(req, s)
    mean_need = float(np.nanmean(part.rate_rps))
    rows_ = []
    for n in range(max(1, int(mean_need)), int(mean_need * 2) + 2):
        rows_.append({"replicas": n, "fluid": simulate(fluid, Fixed(n), cold, s).slo_attainment,
                      "per_request": simulate(per_request, Fixed(n), cold, s).slo_attainment})
    doc = {"trace": part.describe(), "requests": len(req.arrival_s), "fluid_requests": float(fluid.curve_rate.sum() * 15),
           "median_cv": float(np.nanmedian(part.cv)) if part.cv is not None else None,
           "settings": "1 req/s per replica, 1 slot, 1 s service, 0.2 s first token, SLO 5 s",
           "fixed_fleets": rows_, "machine": machine()}
    out.write_text(json.dumps(doc, indent=2))
    return doc


ORACLE_RATIO_TARGET = 1.2  # the target: Preheat's cost_at_slo at most 1.2x the oracle's


def why_missed(policies: dict[str, Any], target: str, fine: dict[str, Any] | None = None) -> str:
    """Why a row misses a target (the lowest non-oracle cost, at most 1.2x the oracle), in terms of the
    points that decide it; empty where both targets hold or no baseline reaches the SLO. `fine` is the row's
    verdict on a grid twice as fine (`bench_fine_grid`), which says whether the 0.1 grid alone decided it."""
    row = compare(policies)[target]
    best, cost = row["best_baseline"], row["cost"]
    if best is None:
        return ""
    reasons = []
    pre = _deciding_point(policies, "preheat", cost["preheat"])
    if pre is None:
        top = max(policies["preheat"]["points"], key=lambda p: p["slo_attainment"])
        reasons.append(f"Preheat's best point reaches {_pct(top)} ({setting_text(top)})")
    elif not row["preheat_lowest"]:
        reasons.append(_why_dearer(policies, row, pre, fine))
    elif fine is not None and fine["best_baseline"] is not None and (fine["margin_vs_best"] or 0.0) < 0.0:
        fb, fc = fine["best_baseline"], fine["cost"]
        reasons.append(f"won on the 0.1 grid only: on the 0.05 grid {fb} reaches it for {fc[fb] / 3600:.1f} h, "
                       f"Preheat for {fc['preheat'] / 3600:.1f} h ({margin_text(fine)})")
    ratio = row["preheat_vs_oracle"]
    if ratio is not None and ratio > ORACLE_RATIO_TARGET and pre is not None:
        o = _deciding_point(policies, "oracle", cost["oracle"])
        reasons.append(f"{ratio:.3f}x the oracle, which reaches it at {setting_text(o)} knowing what comes; "
                       f"Preheat needs {setting_text(pre)} (headroom for what it cannot see coming)")
    return "; ".join(reasons)


def _why_dearer(policies: dict[str, Any], row: dict[str, Any], pre: dict[str, Any],
                fine: dict[str, Any] | None) -> str:
    best = row["best_baseline"]
    b = _deciding_point(policies, best, row["cost"][best])
    top_u = max(UTILIZATIONS)
    if fine is not None and fine["best_baseline"] is not None and (fine["margin_vs_best"] or 0.0) > 0.0:
        return (f"the grid: {best}'s point ({setting_text(b)}) lands at {_pct(b)}, just past the target; "
                f"on the 0.05 grid Preheat is the cheaper ({margin_text(fine)})")
    interp = row["interpolated"]
    if fine is None and interp["best_baseline"] is not None and (interp["margin_vs_best"] or 0.0) > 0.0:
        return (f"the grid: {best}'s point ({setting_text(b)}) lands at {_pct(b)}, just past the target; "
                f"between grid points Preheat's curve is the cheaper")
    if pre.get("target_utilization") == top_u and b.get("target_utilization") == top_u:
        return (f"both reach it only at U {top_u:g}, the grid's end, where Preheat's point buys {_pct(pre)} "
                f"for {_hours(pre)} and {best}'s {_pct(b)} for {_hours(b)}: attainment past the target that "
                f"no setting sells back")
    return (f"{best}'s frontier lies below Preheat's here: {_pct(b)} for {_hours(b)} at {setting_text(b)}, "
            f"Preheat {_pct(pre)} for {_hours(pre)} at {setting_text(pre)}")


def _deciding_point(policies: dict[str, Any], name: str, cost: float | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    return next(p for p in policies[name]["points"] if p["replica_seconds"] == cost)


def _pct(p: dict[str, Any]) -> str:
    return f"{100 * p['slo_attainment']:.2f} %"


def _hours(p: dict[str, Any]) -> str:
    return f"{p['replica_seconds'] / 3600:.1f} h"


Fine = dict[tuple[str, str], dict[str, Any]]


def fine_rows(fine: Fine | None, d: dict[str, Any], f: str) -> dict[str, Any] | None:
    """This (trace, cold start, warm cost)'s verdicts on the 0.05 grid (`bench_fine_grid`), if measured on
    this row's sweeps (a 0.05 grid made from other sweeps, e.g. before a rerun of Preheat's, is not used)."""
    doc = (fine or {}).get((d["trace_key"], d["cold_key"]))
    res = doc["warm_cost_fractions"].get(f) if doc else None
    if res is None or f not in d["warm_cost_fractions"]:
        return None
    ours = d["warm_cost_fractions"][f]["policies"]
    for name, sweep_ in res["policies"].items():
        if name in ("fixed", "oracle") or name not in ours:  # kept as stored, not swept finer
            continue
        if [p for p in sweep_["points"] if p["target_utilization"] in UTILIZATIONS] != ours[name]["points"]:
            return None
    return res["rows"]


def markdown(docs: list[dict[str, Any]], fine: Fine | None = None) -> str:
    """The frontier table: every policy's cost at each SLO, Preheat's margin and its ratio to the oracle on
    the 0.1 grid, then on the 0.05 grid where it was measured (`bench_fine_grid`; else interpolated
    between the 0.1 grid's points, marked ≈), and why a target is missed."""
    names = [n for n in POLICY_NAMES]
    head = ("| trace | cold start | warm cost | SLO | " + " | ".join(names)
            + " | Preheat vs best baseline | Preheat / oracle (0.05 grid) | Preheat vs best baseline, 0.05 grid"
            " | where a target is missed, why |")
    lines = [head, "|" + "---|" * 4 + "---:|" * (len(names) + 3) + "---|"]
    for d in docs:
        for f, res in d["warm_cost_fractions"].items():
            label = f if f == "1" else (f"{f} (stand-in)" if d.get("cpu_warm_fraction_is_a_standin") else f"{f} (CPU)")
            finer = fine_rows(fine, d, f)
            # recomputed from the points: rows stored before a field was added get it too
            for target, row in compare(res["policies"]).items():
                def h(x: float | None) -> str:
                    return "—" if x is None else f"{x / 3600:.1f}"

                cells = [("**" + h(row["cost"][n]) + "**") if n == "preheat" else h(row["cost"][n]) for n in names]
                m, r = row["margin_vs_best"], row["preheat_vs_oracle"]
                second = finer[target] if finer else row["interpolated"]
                mark = "" if finer else "≈ "
                margin = "no baseline reaches it" if row["best_baseline"] is None else (
                    "Preheat does not reach it" if m is None
                    else f"{100 * abs(m):.1f} % {'below' if m > 0 else 'above'} {row['best_baseline']}")
                lines.append(f"| {d['trace_key']} | {d['cold_key']} | {label} | {100 * float(target):g} % | "
                             + " | ".join(cells) + f" | {margin} | {oracle_ratio_text(r, second, mark)} | "
                             + mark + margin_text(second) + " | "
                             + why_missed(res["policies"], target, finer[target] if finer else None) + " |")
    return "\n".join(lines)


def glance(docs: list[dict[str, Any]], fine: Fine | None = None) -> str:
    """The table's verdicts on one screen: per trace and SLO target, one cell per cold start with
    Preheat's cost against the cheapest baseline's at warm cost 1 (signed: -6.0 % is 6 % cheaper), on
    the 0.1 grid and (in brackets) on the 0.05 grid where it was measured, else between the 0.1 grid's
    points (marked ≈); where the CPU warm pool changes the figures, those follow."""
    colds = list(COLDS)
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for d in docs:
        per_warm = {f: (compare(res["policies"]), fine_rows(fine, d, f)) for f, res in d["warm_cost_fractions"].items()}
        for target in per_warm.get("1", ({}, None))[0]:
            texts = [_signed(v[target], fv[target] if fv else None) for v, fv in per_warm.values()]
            text = texts[0] if len(set(texts)) == 1 else f"{texts[0]}; CPU warm pool {'; '.join(texts[1:])}"
            cells.setdefault((d["trace_key"], target), {})[d["cold_key"]] = text
    lines = ["| trace | SLO | " + " | ".join(f"{c} cold start" for c in colds) + " |",
             "|---|---|" + "---|" * len(colds)]
    for (trace, target), row in cells.items():
        lines.append(f"| {trace} | {100 * float(target):g} % | "
                     + " | ".join(row.get(c, "not run") for c in colds) + " |")
    return "\n".join(lines)


def _signed(row: dict[str, Any], fine: dict[str, Any] | None = None) -> str:
    """`−6.0 % aibrix (−5.4 % aibrix)`: Preheat against the cheapest baseline on the 0.1 grid, then on the
    0.05 grid (`fine`), or between the 0.1 grid's points (`≈`; whose cheapest baseline may be another)."""
    if row["best_baseline"] is None:
        pre = row["cost"].get("preheat")
        return "no baseline reaches it" + ("" if pre is None else f"; Preheat does, {pre / 3600:.1f} h")
    if row["margin_vs_best"] is None:
        return f"Preheat does not reach it ({row['best_baseline']} does)"
    text = f"{_percent(row['margin_vs_best'])} {row['best_baseline']}"
    second, mark = (fine, "") if fine is not None else (row["interpolated"], "≈ ")
    if second["margin_vs_best"] is not None:
        text += f" ({mark}{_percent(second['margin_vs_best'])} {second['best_baseline']})"
    return text


def _percent(margin: float) -> str:
    """Preheat's cost relative to the baseline's, signed; two decimals where one would read +0.0."""
    x = -100 * margin
    return (f"{x:+.2f} %" if abs(x) < 0.05 else f"{x:+.1f} %").replace("-", "−")


def oracle_ratio_text(ratio: float | None, between: dict[str, Any], mark: str = "") -> str:
    """Preheat / oracle on the grid, and in brackets on a finer grid or between grid points (`mark`)."""
    if ratio is None:
        return "—"
    b = between.get("preheat_vs_oracle")
    return f"{ratio:.2f}×" + ("" if b is None else f" ({mark}{b:.2f}×)")


def count_cheapest(verdicts: Iterable[dict[str, Any]]) -> tuple[int, int, int]:
    """(rows some baseline reaches, those where Preheat is the cheapest on the grid, interpolated) over
    rows with `best_baseline`, `margin_vs_best` and `interpolated.margin_vs_best` (a margin >= 0 wins)."""
    n = grid = interp = 0
    for v in verdicts:
        if v["best_baseline"] is None:
            continue
        n += 1
        grid += v["margin_vs_best"] is not None and v["margin_vs_best"] >= 0
        m = v["interpolated"]["margin_vs_best"]
        interp += m is not None and m >= 0
    return n, grid, interp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.bench_frontier", description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="bench-results")
    ap.add_argument("--traces-dir", default=default_traces_dir())
    ap.add_argument("--only", help="comma list of trace keys")
    ap.add_argument("--colds", default=",".join(COLDS), help="comma list of cold-start keys: 30 s, measured, 300 s")
    ap.add_argument("--burst-check", action="store_true",
                    help="only compare the fluid model's bursty arrivals with the per-request engine on an m-small slice")
    ap.add_argument("--table-only", action="store_true", help="only rebuild frontier.md from the JSON files")
    ap.add_argument("--preheat-only", action="store_true",
                    help="rerun Preheat's sweeps only; keep the baselines' and the oracle's from the stored JSON")
    ap.add_argument("--oracle-only", action="store_true",
                    help="rerun the oracle's sweeps only; keep Preheat's and the baselines' from the stored JSON")
    args = ap.parse_args(argv)
    if args.preheat_only and args.oracle_only:
        ap.error("--preheat-only and --oracle-only each keep what the other reruns: pick one")
    tdir, out_dir = Path(args.traces_dir), Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = args.only.split(",") if args.only else list(TRACES)
    if args.burst_check:
        doc = burst_check(tdir / TRACES["m-small"], out_dir / "frontier_burst_check.json")
        for r in doc["fixed_fleets"]:
            print(f"{r['replicas']:>3} replicas: fluid {100 * r['fluid']:.3f} %, per-request {100 * r['per_request']:.3f} %")
        return 0
    for key in [] if args.table_only else keys:
        path = tdir / TRACES[key]
        if not path.exists():
            print(f"skipping {key}: {path} not found", file=sys.stderr)
            continue
        for cold_key in (c.strip() for c in args.colds.split(",")):
            run_one(key, path, cold_key, COLDS[cold_key] or str(tdir / COLD_FILE), out_dir, args.preheat_only,
                    args.oracle_only)
            write_table(out_dir)
    print("\n" + write_table(out_dir))
    return 0


def rows_in(out_dir: Path, pattern: str) -> list[dict[str, Any]]:
    """The benchmark's row documents (those with a `trace_key`) among `out_dir`'s files matching `pattern`,
    in the table's order: trace, then cold start."""
    docs = [d for d in (json.loads(p.read_text()) for p in out_dir.glob(pattern)) if "trace_key" in d]
    order, colds = {k: i for i, k in enumerate(TRACES)}, {k: i for i, k in enumerate(COLDS)}
    return sorted(docs, key=lambda d: (order.get(d["trace_key"], 99), colds.get(d["cold_key"], 99)))


def write_table(out_dir: Path) -> str:
    """frontier.md from every frontier-*.json in `out_dir` this benchmark wrote (runs may be split across
    processes); a plain `preheat frontier --json` beside them (one trace, no `trace_key`) is not a row."""
    docs = [d for d in rows_in(out_dir, "frontier-*.json") if not d.get("utilizations_added")]
    fine = {(d["trace_key"], d["cold_key"]): d for d in rows_in(out_dir, "frontier-fine-*.json")}
    table = markdown(docs, fine)
    (out_dir / "frontier.md").write_text(table + "\n")
    (out_dir / "frontier-glance.md").write_text(glance(docs, fine) + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())
