"""`preheat simulate`: replay a trace through Preheat and the baseline autoscalers, print a table,
write JSON and a plot. Bad input exits with status 2 and a message saying what is wrong."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from preheat.sim.run import (
    DEFAULT_TARGET_UTILIZATION,
    POLICY_NAMES,
    SimError,
    SimSettings,
    make_policy,
    prepare_workload,
    simulate,
)
from preheat.sim.traces import TraceError, load_cold_start, load_trace


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="preheat simulate", description=__doc__)
    p.add_argument("--trace", required=True, help="per-request CSV/JSONL or a t_s,total_rate_rps series")
    p.add_argument("--policy", default="all", help=f"{'|'.join(POLICY_NAMES)}|all, or a comma list (default all)")
    p.add_argument("--slo-ms", type=float, default=5000.0, help="latency budget on time to first token (default 5000)")
    p.add_argument("--cold-start", default="30", help="seconds, or a CSV with cold_start_ms / cold_start_s (default 30)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity-rps", type=float, help="requests/s one replica serves flat out (default: auto)")
    cap.add_argument("--capacity-tps", type=float, help="tokens/s one replica serves flat out (scale on tokens)")
    p.add_argument("--slots", type=int, help="concurrency slots per replica (per-request traces)")
    p.add_argument("--peak-replicas", type=int, default=20,
                   help="auto capacity: size a replica so the trace's peak needs this many (default 20)")
    p.add_argument("--target-utilization", type=float, default=None,
                   help=f"every policy aims at this (default: the --spec's scaling.targetUtilization, else "
                   f"{DEFAULT_TARGET_UTILIZATION:g})")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's request rate (default 1)")
    p.add_argument("--promotion-s", type=float, default=2.0, help="warm -> serving promotion time (default 2)")
    p.add_argument("--prefill-tps", type=float, default=40_000.0, help="prefill tokens/s of one request (default 40000)")
    p.add_argument("--decode-ms", type=float, default=25.0, help="decode time per output token (default 25 ms)")
    p.add_argument("--max-replicas", type=int, default=1000)
    p.add_argument("--spec", metavar="FILE.yaml",
                   help="an InferenceEndpoint whose scaling Preheat runs (default: the CRD's defaults); the "
                   "simulated fleet's capacity replaces its targetPerReplica, and its targetUtilization is "
                   "what every policy aims at unless --target-utilization says otherwise")
    p.add_argument("--warm-cost-fraction", type=float, default=1.0,
                   help="a warm replica's cost relative to a serving one (default 1.0: a GPU held idle)")
    p.add_argument("--score-after", type=float, default=0.0, metavar="SECONDS",
                   help="a warm-up: score only requests arriving from this time on and bill replicas from it "
                   "(every policy still runs from the start; default 0)")
    p.add_argument("--smooth", action="store_true",
                   help="series: arrivals inside a window as a smooth flow (default: with its recorded CV)")
    p.add_argument("--preheat", action="append", default=[], metavar="KEY=VALUE",
                   help="override a PolicyConfig field of Preheat (repeatable), e.g. warm_pool_max=6")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_out", help="write results here")
    p.add_argument("--plot", help="write a PNG here")
    p.add_argument("--plot-window", metavar="START_H:END_H",
                   help="zoom the plot on this span of hours, e.g. 48:72 for the third day")
    return p


def parse_overrides(items: list[str]) -> dict[str, Any]:
    from dataclasses import fields

    from preheat.scaling.policy import PolicyConfig

    known = {f.name for f in fields(PolicyConfig)} | {"forecaster"}
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SimError(f"--preheat expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if k.strip() not in known:
            raise SimError(f"--preheat: {k.strip()!r} is not a PolicyConfig field; known: {', '.join(sorted(known))}")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def policies_from(arg: str) -> list[str]:
    names = list(POLICY_NAMES) if arg == "all" else [x.strip() for x in arg.split(",") if x.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise SimError(f"unknown policy {', '.join(unknown) or arg!r}; choose from {', '.join(POLICY_NAMES)} or all")
    return names


def _json_safe(x: Any) -> Any:
    if hasattr(x, "item") and not isinstance(x, list | tuple | dict):  # a numpy scalar (np.float64, np.bool_)
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def plot_window(arg: str | None) -> tuple[float, float] | None:
    if not arg:
        return None
    try:
        a, b = (float(x) * 3600.0 for x in arg.split(":"))
    except ValueError:
        raise SimError(f"--plot-window expects START_H:END_H, got {arg!r}") from None
    if not b > a:
        raise SimError(f"--plot-window end must be after its start, got {arg!r}")
    return a, b


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = policies_from(args.policy)
    window = plot_window(args.plot_window)
    settings = settings_from(args)
    trace = load_trace(args.trace, args.rate_scale, args.seed)
    cold = load_cold_start(args.cold_start)
    w = prepare_workload(trace, settings)
    results = []
    for name in names:
        try:
            results.append(simulate(w, make_policy(name, settings, w, cold), cold, settings))
        except ValueError as e:
            raise SimError(f"{name}: {e}") from None
    out = {
        "trace": trace.describe(),
        "fleet": w.describe(),
        "cold_start": cold.label,
        "slo_ms": settings.slo_ms,
        "target_utilization": settings.target_utilization,
        "warm_cost_fraction": settings.warm_cost_fraction,
        "score_after_s": settings.score_after_s,
        "spec": args.spec,
        "policies": {r.policy: _json_safe(r.summary()) for r in results},
    }
    print(f"{trace.describe()}\n{w.describe()}; cold start {cold.label}; SLO {settings.slo_ms:g} ms TTFT"
          + scored_from(settings))
    print(format_table(out["policies"]))
    if getattr(args, "by_day", False):
        print(format_days(out["policies"]))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=2))
    if args.plot:
        from preheat.sim.plot import plot_results

        plot_results(results, w, args.plot, title=f"{trace.name}, cold start {cold.label}", window_s=window,
                     utilization=settings.target_utilization)
    return out


def settings_from(args: argparse.Namespace) -> SimSettings:
    """The run's settings from the shared flags (`preheat simulate` and `preheat frontier`)."""
    if args.slots is not None and args.slots < 1:
        raise SimError(f"--slots must be at least 1, got {args.slots}")
    if args.peak_replicas < 1:
        raise SimError(f"--peak-replicas must be at least 1, got {args.peak_replicas}")
    if not (math.isfinite(args.warm_cost_fraction) and 0 < args.warm_cost_fraction <= 1):
        raise SimError(f"--warm-cost-fraction must be in (0, 1], got {args.warm_cost_fraction!r}")
    spec = None
    if args.spec:
        from preheat.sim.preheat_policy import load_spec

        spec = load_spec(args.spec)
    return SimSettings(
        slo_ms=args.slo_ms, capacity_rps=args.capacity_rps, capacity_tps=args.capacity_tps, slots=args.slots,
        target_utilization=target_utilization(args.target_utilization, spec), peak_replicas=args.peak_replicas,
        prefill_tokens_per_s=args.prefill_tps, decode_s_per_token=args.decode_ms / 1000.0,
        promotion_s=args.promotion_s, max_replicas=args.max_replicas, seed=args.seed,
        preheat_overrides=parse_overrides(args.preheat), warm_cost_fraction=args.warm_cost_fraction, spec=spec,
        bursty=not args.smooth, score_after_s=args.score_after,
    )


def scored_from(settings: SimSettings) -> str:
    """The header's note of a warm-up left unscored (empty without one)."""
    return f"; scored from {settings.score_after_s:g} s (--score-after)" if settings.score_after_s else ""


def target_utilization(flag: float | None, spec: Any) -> float:
    """What every policy aims at: the flag when given, else the spec's targetUtilization (so `--spec`
    simulates the endpoint as the operator would run it), else the default."""
    if flag is not None:
        return flag
    return float(spec.scaling.target_utilization) if spec is not None else DEFAULT_TARGET_UTILIZATION


def _ms(v: float | None, requests: bool) -> str:
    """A latency cell: None is no request served (inf), or no request at all (-)."""
    return f"{v:.0f}" if v is not None else "inf" if requests else "-"


def format_table(policies: dict[str, dict[str, Any]]) -> str:
    head = f"{'policy':<8} {'SLO %':>8} {'p50 ms':>9} {'p99 ms':>9} {'replica-h':>10} {'actions':>8} {'cold':>6} {'promo':>6}"
    rows = [head]
    for name, r in policies.items():
        p50, p99 = (_ms(r[k], r["requests"] > 0) for k in ("p50_latency_ms", "p99_latency_ms"))
        rows.append(
            f"{name:<8} {100 * r['slo_attainment']:>8.2f} {p50:>9} {p99:>9} "
            f"{r['replica_seconds'] / 3600:>10.2f} {r['scale_actions']:>8} {r['cold_starts']:>6} {r['promotions']:>6}"
        )
    return "\n".join(rows)


def format_days(policies: dict[str, dict[str, Any]]) -> str:
    """Per policy and day: requests, those that missed the SLO, attainment, replica-hours."""
    rows = []
    for name, r in policies.items():
        rows.append(f"{name} by day: {'day':>4} {'requests':>12} {'late':>10} {'SLO %':>8} {'replica-h':>10}")
        for d in r["days"]:
            att = 100 * (1 - d["late"] / d["requests"]) if d["requests"] else 100.0
            rows.append(f"{'':<{len(name) + 8}} {d['day']:>4} {d['requests']:>12.0f} {d['late']:>10.0f} "
                        f"{att:>8.2f} {d['replica_seconds'] / 3600:>10.2f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    p.add_argument("--by-day", action="store_true",
                   help="also print, per policy and day of the trace, the requests, those that missed the "
                   "SLO and the replica-hours (where a multi-day SLO is lost)")
    args = p.parse_args(argv)
    try:
        run(args)
    except (TraceError, SimError, ValueError) as e:
        print(f"preheat simulate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
