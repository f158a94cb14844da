"""`preheat operator`: run the Kopf operator (all namespaces or a list), with metrics and peering."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the Kubernetes object if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            out["namespace"] = ref.get("namespace")
            out["object"] = ref.get("name")
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="preheat operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[],
                       help="watch this namespace (repeat for several); default: all namespaces")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, in-cluster, ~/.kube/config")
    p.add_argument("--prometheus-url", default=os.environ.get("PREHEAT_PROMETHEUS_URL", "http://127.0.0.1:9090"),
                   help="Prometheus that scrapes the model servers (a spec may override it)")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("PREHEAT_METRICS_PORT", "8080")),
                   help="serve operator metrics on this port (0: off)")
    p.add_argument("--metrics-addr", default="0.0.0.0")
    p.add_argument("--liveness-port", type=int, default=0,
                   help="serve Kopf's liveness probe on http://0.0.0.0:PORT/healthz (0: off)")
    p.add_argument("--peering", default=None,
                   help="Kopf peering name: replicas sharing it never act at once (default: standalone)")
    p.add_argument("--priority", type=int, default=0, help="peering priority (higher wins)")
    p.add_argument("--peering-lifetime", type=int, default=60,
                   help="seconds a silent peer counts as alive: how long a replica waits after the acting one died")
    p.add_argument("--identity", default=None,
                   help="this replica's name in peering, Events (reportingInstance) and .status.operator "
                        "(default: $POD_ID or $POD_NAME, else user@host/pid)")
    p.add_argument("--reactive-only", action="store_true",
                   help="ignore forecasts and keep no warm pool (baseline for comparisons)")
    p.add_argument("--interval", type=float, default=None,
                   help="override every endpoint's scaling.intervalSeconds (tests, demos)")
    p.add_argument("--activator-image", default=os.environ.get("PREHEAT_ACTIVATOR_IMAGE") or None,
                   help="image of the activator pods that hold requests of scale-to-zero endpoints "
                        "(default: preheat/operator:<operator version>; the chart passes its own operator image)")
    p.add_argument("--log-format", choices=("json", "plain"), default="json")
    p.add_argument("--verbose", "-v", action="store_true")
    return p.parse_args(argv)


def default_identity() -> str:
    """The pod's name in a cluster ($POD_ID as Kopf's own detection reads it, or $POD_NAME as the chart
    sets it), else user@host/pid."""
    pod = os.environ.get("POD_ID") or os.environ.get("POD_NAME")
    if pod:
        return pod
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    identity = args.identity or default_identity()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if args.log_format == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("urllib3", "kubernetes", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import kopf

    from preheat.controller import handlers, kube, metrics  # noqa: F401 - handlers register on import
    from preheat.controller.loop import Controller, Options

    creds = kube.configure(args.kubeconfig)
    # The kubernetes client builds its API classes on first use (seconds of pydantic work): do it now,
    # before the first endpoint waits for it.
    from kubernetes import client

    for api in (client.CoreV1Api, client.AppsV1Api, client.PolicyV1Api, client.CustomObjectsApi):
        api(kube.shared_api())
    logging.getLogger("preheat").info("API server %s (%s); Prometheus %s; identity %s%s", creds.server,
                                      creds.source, args.prometheus_url, identity,
                                      f"; peering {args.peering!r} priority {args.priority}" if args.peering else "")
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_addr)
    memo = kopf.Memo(
        credentials=creds,
        controller=Controller(Options(args.prometheus_url, args.reactive_only, args.interval, identity,
                                      args.activator_image)),
        peering_priority=args.priority,
        peering_lifetime=args.peering_lifetime,
        identity=identity,
    )
    namespaces = list(args.namespace)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces or (),
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        identity=identity,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
        memo=memo,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
