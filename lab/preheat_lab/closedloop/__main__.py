"""`python -m preheat_lab.closedloop`: run preheat against reactive-only and the real HPA, KEDA and
AIBrix on a cluster.

Writes the JSON (`--out`), a PNG (`--plot`) and prints live progress plus a one-line summary.
Without `--kubeconfig` it uses the local cluster in `--cluster-state` (default: the local cluster's own,
`preheat_cluster.launcher.default_state_dir`), whose
Prometheus also scrapes the operator's /metrics through file service discovery; with the `hpa`, `keda`
or `aibrix` mode it also starts that peer there (once; `bash cluster/build-peers.sh
prometheus-adapter|keda|aibrix` builds it). With `--kubeconfig`, the cluster must run the peers itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from preheat_server.hardware import machine_record

from . import modelstore as MS
from . import workload as W
from .experiment import MODES, LoopConfig, compare, step_floor_ms
from .plot import plot_comparison

DEFAULT_TRACE = "../shared/traces/servegen_m-small_10min.csv"
DEFAULT_START_S = 86400 + W.SLICE_START_IN_DAY_S  # day 2, 03:30 (see preheat_lab.closedloop.workload)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m preheat_lab.closedloop", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kubeconfig", type=Path, help="cluster to use (default: the local cluster's)")
    p.add_argument("--prometheus-url", help="Prometheus the operator queries (default: the local cluster's)")
    p.add_argument("--cluster-state", type=Path, default=None, help="local cluster state dir (default: the local cluster's)")
    p.add_argument("--trace", type=Path, default=Path(DEFAULT_TRACE), help="any trace preheat.sim.traces reads")
    p.add_argument("--start-s", type=float, default=DEFAULT_START_S, help="slice start, trace seconds")
    p.add_argument("--duration-s", type=float, default=W.SLICE_DURATION_S, help="slice length, trace seconds")
    p.add_argument("--compress", type=float, default=W.COMPRESS, help="time compression factor")
    p.add_argument("--rate-scale", type=float, default=W.RATE_SCALE, help="multiply the trace's request rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", "--autoscalers", dest="modes", default="preheat,reactive",
                   help=f"comma-separated subset of {', '.join(MODES)}, run back to back in this order")
    p.add_argument("--hpa-rate-window", default=None,
                   help="hpa mode: prometheus-adapter's rate window (default: the window Preheat's rate reads, 20s)")
    p.add_argument("--aibrix-request-s", type=float, default=None,
                   help="aibrix mode: seconds a request spends in a replica, for its Little's-law target "
                        "(default: with --replica-rps, the paced answer time; else aibrix.DEFAULT_REQUEST_S)")
    p.add_argument("--target-per-replica", type=float, default=1.5, help="requests/s one serving replica takes")
    p.add_argument("--max-replicas", type=int, default=5)
    p.add_argument("--slo-ms", type=float, default=3000.0, help="end-to-end latency budget per request")
    p.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="time-to-first-token budget per request")
    p.add_argument("--no-stream", action="store_true",
                   help="send non-streamed requests (no time to first token is measured)")
    p.add_argument("--interval-s", type=float, default=3.0, help="the operator's decision interval")
    p.add_argument("--max-num-seqs", type=int, default=2, help="model-server slots per replica")
    p.add_argument("--replica-rps", type=float, default=2.0,
                   help="what one replica serves, req/s: the model server's step floor is set from it and the "
                        "workload's mean answer length (an accelerator's decode step; default %(default)s, "
                        "targetPerReplica 1.5 at 75 %%); 0: as fast as the host's shared cores run")
    p.add_argument("--max-queue", type=int, default=4, help="model-server queue bound (429 beyond)")
    p.add_argument("--forecaster", default="holt-winters", help="spec.scaling.forecasting.forecaster")
    p.add_argument("--forecast-window-s", type=float, default=45.0,
                   help="spec.scaling.forecasting.windowSeconds (0: the lead time only)")
    p.add_argument("--model-store", action=argparse.BooleanOptionalAction, default=True,
                   help="every replica downloads the model from a store on a tc-shaped link (model.uri), so its "
                        "cold start includes a download, as in production (local cluster, inside Preheat's "
                        "network namespace); --no-model-store: the built-in model from the node's cache")
    p.add_argument("--download-s", type=float, default=MS.DEFAULT_DOWNLOAD_S,
                   help="model store: the link's rate is set so one replica alone downloads the model in this time")
    p.add_argument("--no-history", action="store_true",
                   help="do not write the trace before the slice into Prometheus (the endpoint has no past)")
    p.add_argument("--out", type=Path, default=Path("bench-results/closedloop.json"))
    p.add_argument("--plot", type=Path, default=Path("bench-results/closedloop.png"))
    p.add_argument("--work-dir", type=Path, default=Path("bench-results/tmp/closedloop"), help="operator logs")
    return p


def summary_line(headline: dict) -> str:
    """The one line a demo ends with."""
    parts = []
    for mode, h in headline.items():
        att = h.get("slo_attainment")
        rs = h.get("replica_seconds")
        lead = h.get("mean_capacity_lead_s")
        loaded = h.get("mean_loaded_capacity_lead_s")
        ttft = h.get("ttft_slo_attainment")
        parts.append(
            f"{mode}: SLO {'-' if att is None else f'{att:.1%}'}"
            + ("" if ttft is None else f" (TTFT {ttft:.1%})") + ", "
            f"{'-' if rs is None else f'{rs:.0f}'} replica-s, "
            f"{h.get('pods_started')} pods started, {h.get('scale_actions')} scale actions, "
            f"{h.get('cold_start_waits')} requests waited on a cold start, "
            + _cold_start_part(h) +
            f"{h.get('cold_starts_hidden')} cold starts hidden by {h.get('promotions')} promotions, "
            f"serving capacity lead {'-' if lead is None else f'{lead:+.0f} s'}, "
            f"loaded capacity lead {'-' if loaded is None else f'{loaded:+.0f} s'}"
            + _forecast_part(h.get("forecast_orders_ahead") or {})
        )
    return " | ".join(parts)


def _cold_start_part(h: dict) -> str:
    cold, dl = h.get("cold_start_p50_s"), h.get("download_p50_s")
    if cold is None:
        return ""
    return (f"cold start p50 {cold:.0f} s (max {h.get('cold_start_max_s') or 0:.0f} s"
            + (f", download p50 {dl:.0f} s" if dl else "") + "), ")


def _forecast_part(f: dict) -> str:
    if not f.get("ordered_by_forecast"):
        return ", no level ordered by the forecast"
    return (f", forecast ordered {f['ordered_by_forecast']} of {f['levels']} levels "
            f"({f['forecast_cold_start_ahead_and_ready']} a cold start ahead and Ready in time, "
            f"up to {f['max_forecast_order_lead_s']:.0f} s ahead)")


def _adapter_starter(cluster):
    """prometheus-adapter on the local cluster with the hpa mode's rules (idempotent: one already
    running is kept, with the rules it was started with)."""

    def start(rules: dict) -> dict:
        from preheat_cluster.peers import start_prometheus_adapter

        print("closed loop: prometheus-adapter behind custom.metrics.k8s.io for the HPA", flush=True)
        t0 = time.monotonic()
        version = start_prometheus_adapter(cluster, rules)
        return {"prometheus_adapter": version, "start_s": round(time.monotonic() - t0, 1)}

    return start


_PEER_BINARIES = {"hpa": (("prometheus-adapter", "prometheus-adapter"),),
                  "keda": (("keda-operator", "keda"), ("keda-adapter", "keda")),
                  "aibrix": (("aibrix-controllers", "aibrix"),)}


def _peer_starter(cluster):
    """KEDA or AIBrix on the local cluster (idempotent: one already running is kept)."""

    def start(mode: str) -> dict:
        print(f"closed loop: starting {mode} on the local cluster", flush=True)
        t0 = time.monotonic()
        if mode == "keda":
            from preheat_cluster.peers_keda import start_keda

            version = start_keda(cluster)
        else:
            from preheat_cluster.peers_aibrix import start_aibrix

            version = start_aibrix(cluster)
        return {mode: version, "start_s": round(time.monotonic() - t0, 1)}

    return start


def _missing_peers(cluster, modes: list[str]) -> str | None:
    """The first peer binary a mode needs that is not built, as an error line (None: all there)."""
    from preheat_cluster import ClusterError
    from preheat_cluster.peers import peer_binary

    for mode in modes:
        for name, build in _PEER_BINARIES.get(mode, ()):
            try:
                peer_binary(cluster, name, build)
            except ClusterError as e:
                return f"the {mode} mode needs {name}: {e}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"error: --modes must be a comma-separated subset of {', '.join(MODES)}", file=sys.stderr)
        return 2
    register = unregister = start_hpa_metrics = start_peer = None
    store = None
    history = None
    kubeconfig, prom = args.kubeconfig, args.prometheus_url
    if kubeconfig is None or prom is None:
        from preheat_cluster import LocalCluster

        from .history import HistoryWriter

        cluster = LocalCluster(state_dir=args.cluster_state) if args.cluster_state else LocalCluster()
        if not cluster.kubeconfig.exists():
            print(f"error: no --kubeconfig and no local cluster in {cluster.state_dir} "
                  "(run `python -m preheat_cluster up`)", file=sys.stderr)
            return 2
        kubeconfig = kubeconfig or cluster.kubeconfig
        prom = prom or cluster.prometheus_url
        register, unregister = cluster.register_scrape_target, cluster.unregister_scrape_target
        missing = _missing_peers(cluster, modes)
        if missing:
            print(f"error: {missing}", file=sys.stderr)
            return 2
        if "hpa" in modes:
            start_hpa_metrics = _adapter_starter(cluster)
        if args.model_store:
            try:
                MS.check_netns()
                store = MS.ModelStore(args.work_dir / "model-store", download_s=args.download_s,
                                      host=cluster.host_address_for_pods, devs=cluster.pod_bridges)
            except MS.ModelStoreError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        start_peer = _peer_starter(cluster)
        if not args.no_history:
            history = HistoryWriter(cluster.bin_dir / "promtool", cluster.state_dir / "prometheus" / "data", prom)
    else:
        if not args.no_history:
            print("note: with --kubeconfig/--prometheus-url the endpoint's past cannot be written into that "
                  "Prometheus; running without it (--no-history)", file=sys.stderr)
        if args.model_store:
            print("note: the model store serves on this host's loopback, which that cluster's pods cannot "
                  "reach; running with the built-in model (--no-model-store)", file=sys.stderr)

    from preheat.sim.traces import TraceError

    # the reader rebases every trace to start at 0, so the slice is in seconds from the trace's start
    start = args.start_s
    try:
        wl = W.load_workload(args.trace, start_s=start, duration_s=args.duration_s, compress=args.compress,
                             rate_scale=args.rate_scale, seed=args.seed)
    except (TraceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    arrivals = wl.arrivals
    if not arrivals:
        print("error: the trace slice holds no requests (check --start-s / --duration-s)", file=sys.stderr)
        return 2
    workload = {"trace": str(args.trace), "start_s": start, "duration_s": args.duration_s,
                "compress": args.compress, "rate_scale": args.rate_scale, "seed": args.seed,
                "requests": len(arrivals), "replay_s": arrivals[-1].t_s,
                "history_s": wl.history_s if history is not None else 0.0}
    min_step_ms = 0.0
    if args.replica_rps > 0:
        mean_tokens = sum(a.max_tokens for a in arrivals) / len(arrivals)
        min_step_ms = step_floor_ms(args.max_num_seqs, args.replica_rps, mean_tokens)
        workload.update(replica_rps=args.replica_rps, mean_output_tokens=mean_tokens, min_step_ms=min_step_ms)
    cfg = LoopConfig(
        kubeconfig=Path(kubeconfig), prometheus_url=str(prom), out_dir=args.work_dir,
        target_per_replica=args.target_per_replica, max_replicas=args.max_replicas, slo_ms=args.slo_ms,
        interval_s=args.interval_s, ttft_slo_ms=args.ttft_slo_ms, stream=not args.no_stream,
        max_num_seqs=args.max_num_seqs, max_queue=args.max_queue, min_step_ms=min_step_ms,
        mean_output_tokens=workload.get("mean_output_tokens"),
        register_target=register, unregister_target=unregister, progress=lambda m: print(m, flush=True),
        forecaster=args.forecaster, time_compression=args.compress,
        forecast_window_s=args.forecast_window_s or None, history=history,
        history_rate=wl.rate if history is not None else None, slice_start_trace_s=wl.slice_start_s,
        history_start_trace_s=wl.history_start_s, hpa_rate_window=args.hpa_rate_window,
        start_hpa_metrics=start_hpa_metrics, start_peer=start_peer, aibrix_request_s=args.aibrix_request_s,
    )
    print(f"closed loop: {len(arrivals)} requests over {arrivals[-1].t_s:.0f} s per mode, modes {', '.join(modes)}",
          flush=True)
    t0 = time.monotonic()
    try:
        if store is not None:  # the same store and link for every mode
            try:
                store.start()
            except MS.ModelStoreError as e:
                print(f"error: model store: {e}", file=sys.stderr)
                return 2
            cfg.model_uri, cfg.model_sha256, cfg.model_store = store.uri, store.archive.sha256, store.describe()
            d = cfg.model_store
            print(f"closed loop: model store {d['uri']}: {d['archive_bytes'] / 1e6:.2f} MB at "
                  f"{d['rate_bit_s'] / 1e6:.2f} Mbit/s shared by all replicas ({d['download_alone_s']:.0f} s alone; "
                  f"like {d['equivalent']})", flush=True)
        comp = asyncio.run(compare(cfg, arrivals, modes, workload))
        if store is not None:  # every replica of every mode: n downloads of the archive
            comp.config["model_store"] = {**cfg.model_store, "link_bytes_sent": store.sent_bytes()}
    finally:
        if store is not None:
            store.stop()
    out = comp.to_json()
    out["wall_s"] = time.monotonic() - t0
    out["machine"] = machine_record()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=float))
    plot_comparison(out, args.plot, cfg.target_per_replica)
    print(f"wrote {args.out} and {args.plot}")
    print("SUMMARY " + summary_line(out["headline"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
