"""`preheat-cluster up|down|status|logs NS/POD`: the local cluster from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .launcher import ClusterError, LocalCluster, default_bin_dir, default_state_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="preheat-cluster", description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="default: .cluster/ in the repo (a dir under /tmp where the repo is too deep for unix sockets)")
    ap.add_argument("--bin-dir", type=Path, default=None, help="default: $PREHEAT_CACHE/bin")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the cluster and wait until it is ready")
    up.add_argument("--nodes", type=int, default=2, help="real nodes (kubelet + containerd each)")
    up.add_argument("--scrape-interval", default=None, help="Prometheus scrape interval (default $PREHEAT_SCRAPE_INTERVAL or 5s)")
    sub.add_parser("down", help="stop every process the cluster started and remove its state")
    sub.add_parser("status", help="each component's state, as JSON")
    lg = sub.add_parser("logs", help="print a pod's container log")
    lg.add_argument("pod", help="NAMESPACE/POD (or POD in namespace default)")
    lg.add_argument("-c", "--container", default=None)
    args = ap.parse_args(argv)

    kw = {"state_dir": args.state_dir or default_state_dir()}
    if args.bin_dir:
        kw["bin_dir"] = args.bin_dir
    if args.cmd == "up":
        kw.update(nodes=args.nodes, scrape_interval=args.scrape_interval)
    cluster = LocalCluster(**kw)
    try:
        if args.cmd == "up":
            took = cluster.up()
            print(json.dumps({"kubeconfig": str(cluster.kubeconfig), "prometheus_url": cluster.prometheus_url,
                              "bin_dir": str(cluster.bin_dir), "ready_after_s": round(took, 1)}))
        elif args.cmd == "down":
            cluster.down()
        elif args.cmd == "status":
            st = cluster.status()
            print(json.dumps(st, indent=2))
            sys.exit(0 if st.get("kube-apiserver") == "ready" else 1)
        elif args.cmd == "logs":
            ns, _, pod = args.pod.rpartition("/")
            path = cluster.pod_log_path(ns or "default", pod, args.container)
            if not path.exists():
                raise ClusterError(f"no log for pod {ns or 'default'}/{pod} at {path}")
            sys.stdout.write(path.read_text(errors="replace"))
    except ClusterError as e:
        print(f"preheat-cluster {args.cmd}: {e}", file=sys.stderr)
        sys.exit(1)


__all__ = ["default_bin_dir", "main"]
