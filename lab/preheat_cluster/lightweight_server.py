"""A tiny real HTTP server with the model server's health routes and request metrics, but no model:
the image `preheat/lightweight-server` runs it, so an operator test can drive hundreds of endpoints
on two cores. Binds `$POD_IP` (else every address: in a pod that is the pod's own network namespace),
port `--port` (8000)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest


class Server:
    """State shared by the handlers: readiness, metrics, and the start-up delay that stands in for a
    model load (so cold starts can be simulated without loading weights)."""

    def __init__(self, model_name: str, startup_delay_s: float):
        self.registry = CollectorRegistry()
        self.received = Counter("preheat:requests_received", "Requests received (arrivals).",
                                ["model_name"], registry=self.registry)
        self.outcomes = Counter("preheat:requests", "Requests by outcome.", ["model_name", "outcome"],
                                registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "Requests being served.", ["model_name"],
                             registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests queued.", ["model_name"], registry=self.registry)
        self.load_s = Gauge("preheat:model_load_seconds", "Seconds from start to ready (the cold start).",
                            ["model_name"], registry=self.registry)
        self.state = Gauge("preheat:server_state", "1 for the current state.", ["model_name", "state"],
                           registry=self.registry)
        self.model_name = model_name
        self.ready = threading.Event()
        self.draining = False
        self.started = time.monotonic()
        # Series exist from the first scrape (at 0), so rate() sees the first request as an increase.
        self.received.labels(model_name)
        for outcome in ("success", "rejected", "invalid"):
            self.outcomes.labels(model_name, outcome)
        self.running.labels(model_name).set(0)
        self.waiting.labels(model_name).set(0)
        self._set_state("loading")
        threading.Timer(startup_delay_s, self._loaded).start()

    def _loaded(self) -> None:
        self.load_s.labels(self.model_name).set(time.monotonic() - self.started)
        self.ready.set()
        self._set_state("ready")

    def _set_state(self, state: str) -> None:
        for s in ("loading", "ready", "draining"):
            self.state.labels(self.model_name, s).set(1 if s == state else 0)


def make_handler(srv: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:  # access logs would swamp the pod log
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: dict) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self) -> None:
            if self.path == "/health/live":
                self._json(200, {"status": "alive"})
            elif self.path == "/health/ready":
                ok = srv.ready.is_set() and not srv.draining
                self._json(200 if ok else 503, {"status": "ready" if ok else ("draining" if srv.draining else "loading")})
            elif self.path == "/metrics":
                self._send(200, generate_latest(srv.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": srv.model_name, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found",
                                           "param": None, "code": 404}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found",
                                           "param": None, "code": 404}})
                return
            srv.received.labels(srv.model_name).inc()
            if not srv.ready.is_set() or srv.draining:
                srv.outcomes.labels(srv.model_name, "rejected").inc()
                self._json(503, {"error": {"message": "server not ready", "type": "unavailable",
                                           "param": None, "code": 503}})
                return
            try:
                json.loads(raw or b"{}")
            except ValueError as e:
                srv.outcomes.labels(srv.model_name, "invalid").inc()
                self._json(400, {"error": {"message": f"invalid JSON body: {e}", "type": "invalid_request_error",
                                           "param": None, "code": 400}})
                return
            srv.outcomes.labels(srv.model_name, "success").inc()
            self._json(200, {"object": "text_completion", "model": srv.model_name,
                             "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="preheat-lightweight-server", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default=os.environ.get("POD_IP") or "0.0.0.0")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default="lightweight")
    ap.add_argument("--startup-delay-s", type=float, default=0.0, help="seconds before /health/ready says ready")
    args, _unknown = ap.parse_known_args(argv)  # model-server flags are accepted and ignored
    srv = Server(args.served_model_name, args.startup_delay_s)
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(srv))
    httpd.daemon_threads = True

    def drain(_signum, _frame):
        # Like the model server: stop being ready, then exit; the kubelet's grace period covers it.
        srv.draining = True
        srv._set_state("draining")
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, drain)
    print(f"lightweight server on http://{args.host}:{args.port}", flush=True)
    httpd.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
