"""`preheat frontier`: what each autoscaler costs to reach a given SLO, its cost-SLO frontier.

Every autoscaler has a headroom knob and a user tunes it until the SLO holds, so one run at each
policy's default answers the wrong question. This sweeps the target utilization U (0.3, 0.4, ...
1.0) of every policy (HPA/KEDA target value, KPA/AIBrix target, Preheat's target per replica: all
U x the per-replica capacity; the oracle, the reference, also over its signal window and a finer U) and the
fixed fleet's size (1 to 1.5x the peak need at full utilization), on one prepared workload (the
same arrivals for every point), and reports for each policy the least replica-seconds among its
points that reach each SLO target (`cost_at_slo`, null if none does), and where Preheat runs with
others, how its cost compares with the cheapest baseline's and the oracle's (`verdict`,
`preheat.sim.verdict`).

    preheat frontier --trace F [every simulate flag] --json OUT.json --plot OUT.png
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
from preheat.sim.baselines import Fixed, Oracle
from preheat.sim.run import SimError, SimSettings, Workload, make_policy, prepare_workload, simulate
from preheat.sim.traces import ColdStartModel, TraceError, load_cold_start, load_trace
from preheat.sim.verdict import SUBJECT, compare, summary

UTILIZATIONS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
SLO_TARGETS = (0.99, 0.999)
FIXED_MAX_POINTS = 24
# The oracle is the reference, not a competitor: with perfect foresight it may also choose, in hindsight,
# how long a burst it rides out in the queue (the window its signal is averaged over) and its headroom on
# a finer grid, so its frontier is a lower bound rather than the 0.1-step grid's rounding error.
# It may also plan to run hotter than U = 1 on its 60 s signal (a lagging policy at U = 1 does, on
# every ramp, and the SLO's slack pays for it).
ORACLE_WINDOWS_S = (15.0, 60.0, 600.0)
ORACLE_U_STEP = 0.05
ORACLE_U_MAX = 1.2


def parser() -> argparse.ArgumentParser:
    p = cli.parser()
    p.prog, p.description = "preheat frontier", __doc__
    p.add_argument("--utilizations", default=",".join(f"{u:g}" for u in UTILIZATIONS),
                   help="comma list of target utilizations to sweep (default 0.3..1.0 by 0.1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="policies swept at once, one process each (default 1; the results are the same)")
    p.add_argument("--slo-targets", default=",".join(f"{x:g}" for x in SLO_TARGETS),
                   help="SLO attainments cost_at_slo is reported for (default 0.99,0.999)")
    return p


def _floats(arg: str, what: str, lo: float, hi: float) -> tuple[float, ...]:
    try:
        xs = tuple(float(x) for x in arg.split(",") if x.strip())
    except ValueError:
        raise SimError(f"--{what} expects a comma list of numbers, got {arg!r}") from None
    if not xs or any(not (lo < x <= hi) for x in xs):
        raise SimError(f"--{what}: every value must be in ({lo:g}, {hi:g}], got {arg!r}")
    return tuple(sorted(set(xs)))


def fixed_sizes(w: Workload) -> list[int]:
    """Fleet sizes from 1 to 1.5x the replicas the peak needs at full utilization."""
    peak_need = max(1, math.ceil(w.peak_rate / w.target_per_replica - 1e-9))
    top = max(2, math.ceil(1.5 * peak_need))
    if top <= FIXED_MAX_POINTS:
        return list(range(1, top + 1))
    step = (top - 1) / (FIXED_MAX_POINTS - 1)
    return sorted({max(1, round(1 + i * step)) for i in range(FIXED_MAX_POINTS)})


def oracle_utilizations(utilizations: tuple[float, ...]) -> tuple[float, ...]:
    """The swept range, up to ORACLE_U_MAX, at ORACLE_U_STEP (the other policies' points included)."""
    lo, hi = min(utilizations), max(*utilizations, ORACLE_U_MAX)
    k = round((hi - lo) / ORACLE_U_STEP)
    return tuple(sorted({*utilizations, *(round(lo + i * ORACLE_U_STEP, 4) for i in range(k + 1))}))


def cost_at_slo(points: list[dict[str, Any]], targets: tuple[float, ...]) -> dict[str, float | None]:
    """Least replica-seconds among the points whose SLO attainment reaches each target."""
    out: dict[str, float | None] = {}
    for target in targets:
        best = cheapest_point(points, target)
        out[f"{target:g}"] = None if best is None else best["replica_seconds"]
    return out


def cheapest_point(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The point (the setting) whose SLO attainment reaches `target` for the fewest replica-seconds."""
    ok = [p for p in points if p["slo_attainment"] >= target - 1e-12]
    return min(ok, key=lambda p: p["replica_seconds"]) if ok else None


def setting_text(point: dict[str, Any]) -> str:
    """A point's setting, as a user would set it: the fleet's size, or U (and the oracle's window)."""
    if point.get("replicas") is not None:
        return f"{point['replicas']} replicas"
    window = point.get("signal_window_s")
    return f"U {point['target_utilization']:g}" + (f", {window:g} s window" if window is not None else "")


def deploy_text(points: list[dict[str, Any]], targets: tuple[float, ...], capacity: float) -> list[str]:
    """What to put in an InferenceEndpoint for Preheat's cheapest point at each SLO target: the frontier's U
    is the spec's scaling.targetUtilization, with targetPerReplica the replica's capacity."""
    lines = []
    for target in targets:
        best = cheapest_point(points, target)
        if best is not None:
            lines.append(f"  at {100 * target:g} %: scaling.targetPerReplica: {capacity:.4g}, "
                         f"scaling.targetUtilization: {best['target_utilization']:g}")
    return lines


def sweep(w: Workload, cold: ColdStartModel, settings: SimSettings, names: list[str],
          utilizations: tuple[float, ...], targets: tuple[float, ...], jobs: int = 1) -> dict[str, Any]:
    """Every policy's frontier on one workload: {name: {points, cost_at_slo, cpu_s}}. `jobs` > 1 sweeps
    that many policies at once, one process each (the points and their order are the same)."""
    args = [(name, w, cold, settings, utilizations, targets) for name in names]
    if jobs > 1 and len(names) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(jobs, len(names))) as pool:
            results = list(pool.map(_sweep_policy, args))
    else:
        results = [_sweep_policy(a) for a in args]
    return dict(zip(names, results, strict=True))


def _sweep_policy(job: tuple[str, Workload, ColdStartModel, SimSettings, tuple[float, ...], tuple[float, ...]]
                  ) -> dict[str, Any]:
    """One policy's points over its knob, its cost at each SLO target and the CPU it took."""
    name, w, cold, settings, utilizations, targets = job
    points, cpu = [], 0.0
    if name == "fixed":
        for n in fixed_sizes(w):
            r = simulate(w, Fixed(n), cold, settings)
            cpu += r.cpu_s
            points.append({"replicas": n, "target_utilization": None, "slo_attainment": r.slo_attainment,
                           "replica_seconds": r.replica_seconds})
    elif name == "oracle":
        for window in ORACLE_WINDOWS_S:
            for u in oracle_utilizations(utilizations):
                s = replace(settings, target_utilization=u)
                r = simulate(w, Oracle(window_s=window), cold, s)
                cpu += r.cpu_s
                points.append({"target_utilization": u, "signal_window_s": window,
                               "slo_attainment": r.slo_attainment, "replica_seconds": r.replica_seconds})
    else:
        for u in utilizations:
            s = replace(settings, target_utilization=u)
            try:
                r = simulate(w, make_policy(name, s, w, cold), cold, s)
            except ValueError as e:
                raise SimError(f"{name} at target utilization {u:g}: {e}") from None
            cpu += r.cpu_s
            points.append({"target_utilization": u, "slo_attainment": r.slo_attainment,
                           "replica_seconds": r.replica_seconds,
                           "warm_replica_seconds": r.replica_seconds_by_state.get("warm", 0.0)})
    result = {"points": points, "cost_at_slo": cost_at_slo(points, targets), "cpu_s": cpu}
    cells = []
    for target in targets:
        best = cheapest_point(points, target)
        cells.append(f"{target:g}: " + ("-" if best is None
                                        else f"{best['replica_seconds'] / 3600:.1f} h ({setting_text(best)})"))
    print(f"  {name:<8} " + "  ".join(cells), flush=True)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = cli.policies_from(args.policy)
    utilizations = _floats(args.utilizations, "utilizations", 0.0, 1.0)
    targets = _floats(args.slo_targets, "slo-targets", 0.0, 1.0)
    settings = cli.settings_from(args)
    trace = load_trace(args.trace, args.rate_scale, args.seed)
    cold = load_cold_start(args.cold_start)
    w = prepare_workload(trace, settings)
    print(f"{trace.describe()}\n{w.describe()}; cold start {cold.label}; SLO {settings.slo_ms:g} ms TTFT; "
          f"warm cost fraction {settings.warm_cost_fraction:g}" + cli.scored_from(settings), flush=True)
    started = time.perf_counter()
    if args.jobs < 1:
        raise SimError(f"--jobs must be at least 1, got {args.jobs}")
    policies = sweep(w, cold, settings, names, utilizations, targets, jobs=args.jobs)
    # The question a user brings: what does holding the SLO cost with Preheat, against what I run today?
    verdict = compare(policies) if SUBJECT in policies and len(policies) > 1 else None
    if verdict is not None:
        print("Preheat against the cheapest baseline (every autoscaler and the fixed fleet; the oracle is the "
              "reference):\n" + "\n".join(summary(verdict)), flush=True)
        print("  (between grid points is a linear estimate that flatters a frontier degrading gradually, "
              "Preheat's; to measure it, sweep a finer grid: --utilizations 0.3,0.35,0.4,...,1)", flush=True)
    deploy = deploy_text(policies[SUBJECT]["points"], targets, w.target_per_replica) if SUBJECT in policies else []
    if deploy:
        print("Preheat's cheapest point, as an InferenceEndpoint's scaling (targetPerReplica in the signal's "
              "unit per replica):\n" + "\n".join(deploy), flush=True)
    out = {
        "trace": trace.describe(), "fleet": w.describe(), "cold_start": cold.label, "slo_ms": settings.slo_ms,
        "warm_cost_fraction": settings.warm_cost_fraction, "spec": args.spec, "bursty": settings.bursty,
        "score_after_s": settings.score_after_s,
        "utilizations": list(utilizations), "slo_targets": list(targets), "policies": policies,
        # the simulations' CPU, in this process or in the --jobs processes
        "cpu_s": sum(p["cpu_s"] for p in policies.values()), "wall_s": time.perf_counter() - started,
        "jobs": args.jobs, "machine": machine(), "verdict": verdict,
    }
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(cli._json_safe(out), indent=2))
    if args.plot:
        plot_frontier(out, args.plot, title=f"{trace.name}, cold start {cold.label}, "
                      f"warm cost {settings.warm_cost_fraction:g}")
    return out


def machine() -> dict[str, Any]:
    """The CPU record every benchmark JSON carries (the model server's, when it is installed)."""
    try:
        from preheat_server.hardware import machine_record
    except ImportError:  # the operator installed alone
        import os
        import platform

        return {"python": platform.python_version(), "os_cpu_count": os.cpu_count(), "platform": platform.platform()}
    return machine_record()


def plot_frontier(result: dict[str, Any], out: str | Path, title: str = "") -> Path:
    """Every policy's frontier on one chart: replica-hours against the share of requests over the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    floor = 1e-5  # a point at 100 % attainment is drawn on this line
    for name, p in result["policies"].items():
        pts = sorted(p["points"], key=lambda x: x["replica_seconds"])
        if name == "oracle":  # its family of (window, U) points: draw its lower envelope
            pts = [x for i, x in enumerate(pts) if all(x["slo_attainment"] > y["slo_attainment"] for y in pts[:i])]
        xs = [x["replica_seconds"] / 3600 for x in pts]
        ys = [max(1 - x["slo_attainment"], floor) for x in pts]
        style = {"lw": 2.4, "zorder": 5} if name == "preheat" else {"lw": 1.2}
        if name == "oracle":
            style = {"lw": 1.2, "ls": "--", "color": "0.3"}
        ax.plot(xs, ys, marker="o", ms=3, label=name, **style)
    for target in result["slo_targets"]:
        ax.axhline(1 - target, color="0.6", lw=0.8, ls=":")
        ax.text(ax.get_xlim()[0], 1 - target, f" SLO {100 * target:g} %", va="bottom", fontsize=8, color="0.4")
    ax.set_yscale("log")
    ax.set_xlabel("replica-hours paid (warm replicas at the warm cost fraction)")
    ax.set_ylabel(f"share of requests over the {result['slo_ms']:g} ms TTFT budget (floor {floor:g} = none)")
    ax.set_title(title or result["trace"], fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        run(args)
    except (TraceError, SimError, ValueError) as e:
        print(f"preheat frontier: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
