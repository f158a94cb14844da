"""`make bench-heldout` (lab: `preheat_lab.bench_heldout`): the frontier on traffic the policy was not tuned on.

The frontier table (`make bench-frontier`) runs the traces the policy was developed against, each with a
replica sized so the peak needs 20 at U = 0.7. A platform engineer's traffic differs: a small endpoint
of a few replicas (where one replica is a quarter of the fleet), a large one of dozens (where the
signal's relative noise is small), a serverless service with idle spans (where Knative and KEDA scale to
zero by default and Preheat's default keeps one replica), a service whose traffic grows or steps (where
yesterday is not today). This benchmark reruns `preheat frontier`, every
policy at its defaults, on such variants of the shared traces and reports Preheat's margin against the
best baseline at each SLO, on the 0.1 grid of U and interpolated between its points. Nothing here was
tuned: it measures where the policy does not win, too.

    python -m preheat_lab.bench_heldout --out bench-results/heldout.json [--only deepseek-r1-idle]

`--only` reruns those variants and keeps the other rows of an existing `--out` file; `--oracle-only` reruns
only the oracle's sweeps in them (the reference) and keeps the other policies'; `--preheat-only` reruns only
Preheat's (after a change to its policy) and keeps the baselines' and the oracle's. `--seed N` draws other
arrivals inside each window (and other cold starts); `--compare-seeds 0=A.json 1=B.json` writes the
per-seed verdicts side by side (`make bench-heldout-seeds`), so a row decided by one draw's luck shows.

Variants (warm cost 1.0, cold start 30 s and 300 s):
- `<trace>-peak4` / `<trace>-peak40`: the trace as is, a replica sized so its peak needs 4 (40) at U = 0.7
  (`--peak-replicas`), for deepseek-r1 (one day, 10-minute windows with their CV), mooncake (one hour of
  requests) and m-small (14 days; peak 40 only);
- `deepseek-r1-idle`, `m-small-idle`: the trace with its quietest 40 % of windows set to zero (a service
  idle in its troughs; m-small's are mostly nights, a pattern its 14 days let a forecaster learn);
  `deepseek-r1-idle-stz`, `m-small-idle-stz`: the same with Preheat's scale to zero on (`minReplicas: 0`,
  `scaleToZero: true`), as a user of such traffic would set it (Knative's KPA and KEDA scale to zero by
  default; the oracle, knowing when the next request comes, does too). At zero pods Preheat's activator
  holds and counts the requests: the operator reads its counter through the same scrape, and the first
  requests wake the endpoint.
- `m-small-growth`, `m-small-step`, `m-small-drop`: m-small's 14 days with its rate growing 3x over the
  trace (a service being adopted), doubled from the middle on (a launch), halved from the middle on (a
  client gone): the forecaster's season and level must follow traffic that does not repeat itself.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preheat.sim import cli
from preheat.sim.frontier import SLO_TARGETS, UTILIZATIONS, machine, sweep
from preheat.sim.run import POLICY_NAMES, prepare_workload
from preheat.sim.traces import load_cold_start, load_trace
from preheat.sim.verdict import compare, margin_text

from preheat_lab.bench_frontier import count_cheapest, oracle_ratio_text, why_missed
from preheat_lab.bench_sim import TRACES, default_traces_dir

COLDS = ("30", "300")
# Traffic that does not repeat itself: (what it is, the rate's factor at a fraction x of the trace's span).
RESHAPES: dict[str, tuple[str, Callable[[float], float]]] = {
    "growth": ("its rate growing 3x over the trace", lambda x: 3.0 ** x),
    "step": ("its rate doubled from the middle on", lambda x: 2.0 if x >= 0.5 else 1.0),
    "drop": ("its rate halved from the middle on", lambda x: 0.5 if x >= 0.5 else 1.0),
}
IDLE_QUANTILE = 0.4  # the quietest 40 % of a trace's windows are idle in its idle variants


@dataclass(frozen=True)
class Variant:
    name: str
    trace_key: str
    peak_replicas: int = 20
    idle: bool = False
    preheat: tuple[str, ...] = ()  # `--preheat KEY=VALUE` settings a user of this traffic would choose
    reshape: str | None = None  # a key of RESHAPES: the trace's rate times a factor over time

    def trace_file(self) -> str:
        """The trace's name in the row's command (a variant's own copy is written to a temporary file)."""
        return "IDLE.csv" if self.idle else f"{self.reshape.upper()}.csv" if self.reshape else self.trace_key

    def describe(self) -> str:
        if self.reshape:
            return f"{self.trace_key}, {RESHAPES[self.reshape][0]}"
        if self.idle:
            user = f"; Preheat with {', '.join(self.preheat)}" if self.preheat else ""
            return f"{self.trace_key}, its quietest {IDLE_QUANTILE:.0%} of windows set to zero{user}"
        return f"{self.trace_key}, a replica sized so the peak needs {self.peak_replicas} at U = 0.7"


VARIANTS = (
    Variant("deepseek-r1-peak4", "deepseek-r1", 4),
    Variant("deepseek-r1-peak40", "deepseek-r1", 40),
    Variant("mooncake-peak4", "mooncake", 4),
    Variant("mooncake-peak40", "mooncake", 40),
    Variant("m-small-peak40", "m-small", 40),
    Variant("deepseek-r1-idle", "deepseek-r1", idle=True),
    Variant("m-small-idle", "m-small", idle=True),
    Variant("deepseek-r1-idle-stz", "deepseek-r1", idle=True, preheat=("min_replicas=0", "scale_to_zero=true")),
    Variant("m-small-idle-stz", "m-small", idle=True, preheat=("min_replicas=0", "scale_to_zero=true")),
    Variant("m-small-growth", "m-small", reshape="growth"),
    Variant("m-small-step", "m-small", reshape="step"),
    Variant("m-small-drop", "m-small", reshape="drop"),
)


def idle_copy(src: Path, out: Path) -> Path:
    """`src` (a t_s,total_rate_rps series) with its quietest IDLE_QUANTILE of windows set to zero (the
    troughs of a daily pattern become idle hours)."""
    with src.open(newline="") as f:
        data = list(csv.DictReader(f))
    rates = sorted(float(r["total_rate_rps"]) for r in data)
    cut = rates[int(IDLE_QUANTILE * len(rates))]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(data[0]))
        w.writeheader()
        for r in data:
            w.writerow(r | {"total_rate_rps": "0"} if float(r["total_rate_rps"]) < cut else r)
    return out


def reshaped_copy(src: Path, out: Path, reshape: str) -> Path:
    """`src` (a t_s,total_rate_rps series) with each window's rate times RESHAPES[reshape]'s factor at
    the window's place in the trace (0 at the first window, 1 at the last); the other columns as they were."""
    factor = RESHAPES[reshape][1]
    with src.open(newline="") as f:
        data = list(csv.DictReader(f))
    t = [float(r["t_s"]) for r in data]
    span = (t[-1] - t[0]) or 1.0
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(data[0]))
        w.writeheader()
        for r, ti in zip(data, t, strict=True):
            w.writerow(r | {"total_rate_rps": f"{float(r['total_rate_rps']) * factor((ti - t[0]) / span):.6g}"})
    return out


def run_variant(v: Variant, path: Path, cold_arg: str, seed: int = 0,
                kept: dict[str, Any] | None = None, rerun: str = "oracle") -> dict[str, Any]:
    """One (variant, cold start) row: every policy's sweep, or with `kept` (that row as stored) only
    `rerun`'s and every other sweep as it was: the oracle's (the reference: the causal policies never
    read it) or Preheat's (after a change to its policy: the baselines and the oracle do not run it)."""
    argv = ["--trace", str(path), "--cold-start", cold_arg, "--peak-replicas", str(v.peak_replicas),
            *(a for kv in v.preheat for a in ("--preheat", kv)), *(("--seed", str(seed)) if seed else ())]
    settings = cli.settings_from(cli.parser().parse_args(argv))
    trace = load_trace(str(path), seed=seed)
    w = prepare_workload(trace, settings)
    started = time.process_time()
    if kept is None:
        policies = sweep(w, load_cold_start(cold_arg), settings, list(POLICY_NAMES), UTILIZATIONS, SLO_TARGETS)
    else:
        again = sweep(w, load_cold_start(cold_arg), settings, [rerun], UTILIZATIONS, SLO_TARGETS)
        policies = {**kept["policies"], **again}
    row = {"variant": v.name, "about": v.describe(), "cold_start_s": float(cold_arg), "seed": seed, "fleet": w.describe(),
           "command": "preheat frontier " + " ".join(argv).replace(str(path), v.trace_file()),
           "policies": policies, "rows": compare(policies), "cpu_s": time.process_time() - started,
           # per row: `--only` reruns keep other rows, which ran on another day (and maybe machine)
           "machine": machine(), "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if kept is not None and rerun == "oracle":
        row["causal_sweeps_from"] = causal_provenance(kept)
    elif kept is not None:
        row |= {"rerun": rerun, "baseline_sweeps_from": baseline_provenance(kept),
                "oracle_sweeps_from": kept.get("oracle_sweeps_from")
                or {k: kept.get(k) for k in ("machine", "finished_utc")}}
    return row


def causal_provenance(kept: dict[str, Any]) -> dict[str, Any]:
    """Where an `--oracle-only` row's kept sweeps (every policy but the oracle) ran: the stored row's own
    record of an earlier `--oracle-only` rerun, else the stored row's run (machine, time, CPU)."""
    if "causal_sweeps_from" in kept:
        return kept["causal_sweeps_from"]
    run = {k: kept.get(k) for k in ("machine", "finished_utc", "cpu_s")}
    if "baseline_sweeps_from" in kept:  # a `--preheat-only` row: Preheat ran then, the baselines earlier
        return {"preheat": run, "baselines": kept["baseline_sweeps_from"]}
    return run


def baseline_provenance(kept: dict[str, Any]) -> dict[str, Any]:
    """Where a `--preheat-only` row's kept baseline sweeps ran: the stored row's record of an earlier
    rerun (of Preheat, or of the oracle: then the baselines ran with the causal sweeps), else its run."""
    return kept.get("baseline_sweeps_from") or causal_provenance(kept)


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| variant | cold start | SLO | Preheat h | best baseline h | on the grid | U interpolated | Preheat / oracle (U interpolated) "
             "| where a target is missed, why |",
             "|---|---|---|---:|---:|---|---|---:|---|"]
    for r in results:
        # recomputed from the points: rows stored before a field was added get it too
        for target, row in compare(r["policies"]).items():
            best, pre, ratio = row["best_baseline"], row["cost"]["preheat"], row["preheat_vs_oracle"]
            best_h = "—" if best is None else f"{row['cost'][best] / 3600:.1f} ({best})"
            lines.append(
                f"| {r['variant']} | {r['cold_start_s']:g} s | {100 * float(target):g} % | "
                f"{'—' if pre is None else f'{pre / 3600:.1f}'} | {best_h} | "
                f"{margin_text(row)} | {margin_text(row['interpolated'])} | "
                f"{oracle_ratio_text(ratio, row['interpolated'])} | "
                f"{why_missed(r['policies'], target)} |")
    return "\n".join(lines)


def tally(results: list[dict[str, Any]]) -> dict[str, int]:
    """Rows some baseline reaches, and in how many Preheat is the cheapest, on the grid and interpolated;
    every policy at its defaults (the variants with a user's Preheat settings, `-stz`, left out)."""
    n, grid, interp = count_cheapest(
        row for r in results if "--preheat" not in r["command"] for row in r["rows"].values())
    return {"rows": n, "cheapest_on_grid": grid, "cheapest_interpolated": interp}


def seeds_markdown(by_seed: dict[int, list[dict[str, Any]]]) -> str:
    """One row per variant, cold start and SLO: Preheat's margin against the best baseline for each seed
    (on the grid / interpolated), then each seed's tally."""
    seeds = sorted(by_seed)
    lines = ["| variant | cold start | SLO | " + " | ".join(f"seed {s}: grid / interpolated" for s in seeds) + " |",
             "|---|---|---|" + "---|" * len(seeds)]
    keyed = {s: {(r["variant"], r["cold_start_s"]): r for r in rs} for s, rs in by_seed.items()}
    for variant, cold in keyed[seeds[0]]:
        for target in keyed[seeds[0]][(variant, cold)]["rows"]:
            cells = []
            for s in seeds:
                r = keyed[s].get((variant, cold))
                row = r["rows"][target] if r else None
                cells.append("—" if row is None else f"{margin_text(row)} / {margin_text(row['interpolated'])}")
            lines.append(f"| {variant} | {cold:g} s | {100 * float(target):g} % | " + " | ".join(cells) + " |")
    lines.append("")
    for s in seeds:
        t = tally(by_seed[s])
        lines.append(f"- seed {s}: Preheat the cheapest in {t['cheapest_on_grid']} of {t['rows']} rows on the grid, "
                     f"{t['cheapest_interpolated']} interpolated (at every policy's defaults)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preheat_lab.bench_heldout", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench-results/heldout.json")
    ap.add_argument("--traces-dir", default=default_traces_dir())
    ap.add_argument("--only", help="comma list of variant names (the other rows of --out are kept)")
    ap.add_argument("--seed", type=int, default=0,
                    help="draw of the arrivals inside each window and of the cold starts (default 0; other "
                    "seeds check that a row's verdict is not one draw's luck: write them to another --out)")
    ap.add_argument("--table-only", action="store_true", help="only rebuild the .md table from --out")
    ap.add_argument("--oracle-only", action="store_true",
                    help="rerun the oracle's sweeps only; keep the other policies' from the rows stored in --out")
    ap.add_argument("--preheat-only", action="store_true",
                    help="rerun Preheat's sweeps only (after a change to its policy); keep the baselines' and "
                    "the oracle's from the rows stored in --out")
    ap.add_argument("--compare-seeds", nargs="+", metavar="SEED=JSON",
                    help="only write --out (markdown) comparing runs of other seeds, e.g. 0=heldout.json "
                    "1=heldout-seed1.json")
    args = ap.parse_args(argv)
    tdir, out = Path(args.traces_dir), Path(args.out)
    if args.compare_seeds:
        runs = {}
        for item in args.compare_seeds:
            seed, _, path = item.partition("=")
            if not seed.strip().isdigit() or not path:
                ap.error(f"--compare-seeds: expected SEED=JSON, got {item!r}")
            runs[int(seed)] = json.loads(Path(path).read_text())["results"]
        table = seeds_markdown(runs)
        out.write_text(table + "\n")
        print(table)
        return 0
    if args.table_only:
        table = markdown(json.loads(out.read_text())["results"])
        out.with_suffix(".md").write_text(table + "\n")
        print(table)
        return 0
    if args.preheat_only and args.oracle_only:
        ap.error("--preheat-only and --oracle-only each keep what the other reruns: pick one")
    rerun, one = ("preheat", "--preheat-only") if args.preheat_only else ("oracle", "--oracle-only")
    only_one = args.preheat_only or args.oracle_only
    wanted = set(args.only.split(",")) if args.only else None
    stored = {(r["variant"], r["cold_start_s"]): r for r in json.loads(out.read_text())["results"]} \
        if only_one and out.exists() else {}
    if only_one and not stored:
        ap.error(f"{one} keeps the other policies' sweeps from --out, and {out} has none")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in VARIANTS:
            if wanted is not None and v.name not in wanted:
                continue
            path = tdir / TRACES[v.trace_key]
            if not path.exists():
                print(f"skipping {v.name}: {path} not found", file=sys.stderr)
                continue
            if v.idle:
                path = idle_copy(path, Path(tmp) / f"{v.name}.csv")
            elif v.reshape:
                path = reshaped_copy(path, Path(tmp) / f"{v.name}.csv", v.reshape)
            for cold in COLDS:
                print(f"== {v.name}, cold start {cold} s", flush=True)
                kept = stored.get((v.name, float(cold)))  # empty unless --oracle-only / --preheat-only
                if only_one and kept is None:
                    print(f"  {v.name} at {cold} s is not in {out}: running every policy", flush=True)
                elif kept is not None and kept.get("seed", 0) != args.seed:
                    ap.error(f"{one}: {out} holds seed {kept.get('seed', 0)}'s draws, not seed {args.seed}'s")
                results.append(run_variant(v, path, cold, args.seed, kept, rerun))
    if wanted is not None and out.exists():  # --only reruns those variants and keeps the others' rows
        kept = [r for r in json.loads(out.read_text())["results"] if r["variant"] not in wanted]
        order = {v.name: i for i, v in enumerate(VARIANTS)}
        results = sorted(kept + results, key=lambda r: (order.get(r["variant"], 99), r["cold_start_s"]))
    table = markdown(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    # `machine` is this run's; each row carries the machine and time it ran on (older rows may not).
    out.write_text(json.dumps(cli._json_safe({"results": results, "machine": machine(),
                                              "utilizations": list(UTILIZATIONS)}), indent=2))
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
