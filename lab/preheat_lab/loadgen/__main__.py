"""`python -m preheat_lab.loadgen`: replay a trace against an endpoint's serving pods (or fixed addresses).

    python -m preheat_lab.loadgen --trace ../shared/traces/azure_llm_2023_code.csv --compress 4 \\
        --kubeconfig .cluster/kubeconfig --namespace default --service tiny-cpu --out replay.json

Prints a progress line every few seconds and a summary; `--out` writes the summary and every
request's record as JSON. Bounded by `--max-requests` and `--max-duration-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from .endpoints import EndpointSliceWatcher, StaticEndpoints
from .replay import ReplayConfig, Replayer, summarize
from .schedule import TokenShaping, from_trace


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m preheat_lab.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="trace file (any format preheat.sim.traces reads)")
    p.add_argument("--compress", type=float, default=1.0, help="time compression factor (10 = 10x faster)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the request rate")
    p.add_argument("--start-s", type=float, default=None, help="slice start, seconds from the trace's start")
    p.add_argument("--duration-s", type=float, default=None, help="slice length in trace seconds")
    p.add_argument("--seed", type=int, default=0)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--service", help="Service whose EndpointSlices list the serving pods")
    target.add_argument("--address", action="append", help="HOST:PORT on loopback (repeatable)")
    p.add_argument("--kubeconfig", type=Path, help="with --service (default: $KUBECONFIG)")
    p.add_argument("--namespace", default="default", help="with --service")
    p.add_argument("--slo-ms", type=float, default=2000.0, help="latency budget per request")
    p.add_argument("--stream", action="store_true", help="stream the answers and measure time to first token")
    p.add_argument("--ttft-slo-ms", type=float, default=None, help="with --stream: time-to-first-token budget")
    p.add_argument("--queue-timeout-s", type=float, default=10.0, help="client-side wait for a serving pod")
    p.add_argument("--request-timeout-s", type=float, default=30.0)
    p.add_argument("--max-requests", type=int, default=5000)
    p.add_argument("--max-duration-s", type=float, default=600.0)
    p.add_argument("--prompt-max", type=int, default=48, help="cap on prompt tokens")
    p.add_argument("--output-max", type=int, default=16, help="cap on max_tokens")
    p.add_argument("--model", help="`model` field (default: ask /v1/models)")
    p.add_argument("--progress-s", type=float, default=5.0, help="seconds between progress lines (0: off)")
    p.add_argument("--out", type=Path, help="write summary + per-request records as JSON")
    return p


async def _run(args: argparse.Namespace, arrivals: list) -> tuple[dict, list]:
    cfg = ReplayConfig(slo_s=args.slo_ms / 1000, queue_timeout_s=args.queue_timeout_s,
                       request_timeout_s=args.request_timeout_s, max_requests=args.max_requests,
                       max_duration_s=args.max_duration_s, model=args.model, stream=args.stream)

    async def replay(source) -> list:
        rp = Replayer(source, cfg)
        task = asyncio.create_task(rp.run(arrivals))
        while args.progress_s > 0 and not task.done():
            await asyncio.wait({task}, timeout=args.progress_s)
            w = rp.window_stats(10.0)
            p99 = w["p99_latency_s"]
            print(f"t={w['t_s']:6.1f}s offered={w['offered_rps']:6.1f} rps completed={w['completed']:4d} "
                  f"in-flight={w['in_flight']:3d} replicas={w['ready_endpoints']} "
                  f"p99={'-' if p99 is None else f'{p99 * 1000:.0f}ms'}", flush=True)
        return await task

    if args.service:
        async with EndpointSliceWatcher(args.kubeconfig, args.namespace, args.service) as eps:
            records = await replay(eps)
    else:
        records = await replay(StaticEndpoints(args.address))
    ttft_slo = args.ttft_slo_ms / 1000 if args.ttft_slo_ms else None
    return summarize(records, cfg.slo_s, ttft_slo), records


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from preheat.sim.traces import TraceError, load_trace

    try:
        shaping = TokenShaping(prompt_max=args.prompt_max, output_max=args.output_max,
                               prompt_min=min(4, args.prompt_max), output_min=min(4, args.output_max))
        trace = load_trace(args.trace)
        arrivals = from_trace(trace, compress=args.compress, rate_scale=args.rate_scale, start_s=args.start_s,
                              duration_s=args.duration_s, shaping=shaping, seed=args.seed)
        if args.address:
            StaticEndpoints(args.address)  # refuse non-loopback addresses before sending anything
    except (TraceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not arrivals:
        print("error: the trace slice holds no requests", file=sys.stderr)
        return 2
    print(f"replaying {min(len(arrivals), args.max_requests)} requests over {arrivals[-1].t_s:.1f} s", flush=True)
    summary, records = asyncio.run(_run(args, arrivals))
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "records": [r.to_dict() for r in records]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
