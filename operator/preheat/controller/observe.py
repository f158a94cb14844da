"""Observations from Prometheus: the PromQL per endpoint and the query calls (prometheus-api-client).

`signal_queries` is pure (tests read it); `PrometheusSource` does the I/O. Any failure — connection
refused, timeout, a PromQL error — becomes `MetricsResult(available=False, reason=...)` and the loop
holds the current size rather than guessing.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from preheat.controller.spec import InferenceEndpointSpec, Signal

log = logging.getLogger("preheat.observe")


def _sel(namespace: str, endpoint: str) -> str:
    return f'namespace="{namespace}",endpoint="{endpoint}"'


def default_queries(namespace: str, endpoint: str, window: str, panic_window: str) -> dict[str, str]:
    """PromQL over the model-server metrics (docs/ARCHITECTURE.md) for one endpoint.

    Arrivals (`preheat:requests_received_total`) rather than completions: a saturated replica
    completes less than it is sent, and the autoscaler must see the demand, not the throughput.
    """
    s = _sel(namespace, endpoint)
    return {
        "rate": f"sum(rate(preheat:requests_received_total{{{s}}}[{window}]))",
        "rate_panic": f"sum(rate(preheat:requests_received_total{{{s}}}[{panic_window}]))",
        "tokens": f"sum(rate(vllm:generation_tokens_total{{{s}}}[{window}]))",
        "tokens_panic": f"sum(rate(vllm:generation_tokens_total{{{s}}}[{panic_window}]))",
        "concurrency": f"sum(avg_over_time(vllm:num_requests_running{{{s}}}[{window}]))"
        f" + sum(avg_over_time(vllm:num_requests_waiting{{{s}}}[{window}]))",
        "concurrency_panic": f"sum(vllm:num_requests_running{{{s}}}) + sum(vllm:num_requests_waiting{{{s}}})",
        "queue": f"sum(vllm:num_requests_waiting{{{s}}})",
        # Sequences in the running batches: with the queue, the policy's instant burst signal.
        "running": f"sum(vllm:num_requests_running{{{s}}})",
        # Targets scraped for this endpoint: tells "no traffic" (targets up, rate 0) from "no data".
        "targets": f"count(up{{{s}}} == 1)",
    }


def substitute(query: str, namespace: str, endpoint: str) -> str:
    return query.replace("$namespace", namespace).replace("$endpoint", endpoint)


def signal_queries(namespace: str, endpoint: str, spec: InferenceEndpointSpec) -> dict[str, str]:
    """The queries the loop runs: `signal`, `signal_panic`, `queue`, `running`, `targets`.

    User overrides replace the stable-window signal query (and the panic one, since a user's query
    has no window we could shorten).
    """
    p = spec.prometheus
    q = default_queries(namespace, endpoint, p.window, p.panic_window)
    key = {Signal.requests_per_second: "rate", Signal.tokens_per_second: "tokens", Signal.concurrency: "concurrency"}[
        spec.scaling.signal
    ]
    signal, panic = q[key], q[f"{key}_panic"]
    override = getattr(p.queries, key)
    if override:
        signal = panic = substitute(override, namespace, endpoint)
    queue = substitute(p.queries.queue, namespace, endpoint) if p.queries.queue else q["queue"]
    out = {"signal": signal, "signal_panic": panic, "queue": queue, "running": q["running"], "targets": q["targets"]}
    if spec.scaling.scale_to_zero:
        out |= activator_queries(namespace, endpoint, p.window, p.panic_window, spec.scaling.signal)
    return out


def activator_queries(namespace: str, endpoint: str, window: str, panic_window: str,
                      signal: Signal) -> dict[str, str]:
    """The activator's counters (routing.py): the signal while no model-server target exists.

    Requests held are the concurrency; for the two rate signals, the requests arriving: at zero pods
    any request at all asks for one replica, and the servers' own counters take over once one serves
    (a tokens/s target has no tokens to count before a server answers)."""
    s = _sel(namespace, endpoint)
    waiting = f"sum(preheat:activator_requests_waiting{{{s}}})"
    if signal is Signal.concurrency:
        rate = panic = waiting
    else:
        rate = f"sum(rate(preheat:activator_requests_total{{{s}}}[{window}]))"
        panic = f"sum(rate(preheat:activator_requests_total{{{s}}}[{panic_window}]))"
    return {"activator": rate, "activator_panic": panic, "activator_waiting": waiting,
            # the activator's gauge is exported from its first scrape: its series tell that it is scraped
            "activator_targets": f"count(preheat:activator_requests_waiting{{{s}}})"}


def history_query(namespace: str, endpoint: str, spec: InferenceEndpointSpec) -> str:
    return signal_queries(namespace, endpoint, spec)["signal"]


@dataclass(frozen=True)
class MetricsResult:
    available: bool
    reason: str
    message: str
    signal: float | None = None
    signal_panic: float | None = None
    queue: float | None = None
    running: float | None = None
    targets: int = 0


def _scalar(result: Any) -> float | None:
    """The one number of an instant-vector answer; None for an empty vector or NaN."""
    if not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class PrometheusSource:
    """Runs the endpoint's queries against one Prometheus (the operator's, or the spec's override)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url
        # No client-side retries: the loop backs off itself and must not stall 200 endpoints on
        # one dead Prometheus.
        self._prom = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0, connect=0, read=0), timeout=int(timeout_s) or 1
        )
        self._timeout = timeout_s

    def _query(self, q: str) -> Any:
        return self._prom.custom_query(query=q, params={"timeout": f"{self._timeout:g}s"})

    def _scalars(self, queries: dict[str, str], keys: tuple[str, ...]) -> list[float | None]:
        """The named queries' numbers (None for a key `queries` lacks); raises what the client raises."""
        return [_scalar(self._query(queries[k])) if k in queries else None for k in keys]

    def observe(self, queries: dict[str, str]) -> MetricsResult:
        try:
            targets, value, panic, queue, running = self._scalars(
                queries, ("targets", "signal", "signal_panic", "queue", "running"))
        except Exception as exc:  # connection refused, timeout, bad PromQL: all mean "no data"
            return self._unreachable(exc)
        if not targets and "activator" in queries:
            return self._observe_activator(queries)
        if not targets:
            return MetricsResult(
                False,
                "NoMetrics",
                "Prometheus has no scraped model-server target for this endpoint yet",
            )
        # Targets are up: an empty rate means no traffic yet, which is a real zero.
        return MetricsResult(
            True,
            "MetricsFound",
            f"{int(targets)} target(s) scraped",
            signal=value if value is not None else 0.0,
            signal_panic=panic if panic is not None else (value if value is not None else 0.0),
            queue=queue,
            running=running,
            targets=int(targets),
        )

    def _unreachable(self, exc: Exception) -> MetricsResult:
        return MetricsResult(False, "PrometheusUnreachable", f"{self.url}: {type(exc).__name__}: {exc}"[:500])

    def _observe_activator(self, queries: dict[str, str]) -> MetricsResult:
        """No model-server target (the endpoint is at zero): the activator's count is the signal."""
        try:
            targets, value, panic, waiting = self._scalars(
                queries, ("activator_targets", "activator", "activator_panic", "activator_waiting"))
        except Exception as exc:
            return self._unreachable(exc)
        if not targets:
            return MetricsResult(False, "NoMetrics",
                                 "Prometheus has no scraped model-server or activator target for this endpoint yet")
        value = value or 0.0
        return MetricsResult(True, "ActivatorMetrics", "no model-server target: the activator's count of requests",
                             signal=value, signal_panic=panic if panic is not None else value,
                             queue=waiting, running=0.0, targets=0)

    def history(self, query: str, start_s: float, end_s: float, step_s: float) -> list[tuple[float, float]]:
        """(time, value) samples of `query` over [start, end]: rebuilds a forecaster after a restart."""
        from datetime import UTC, datetime

        try:
            result = self._prom.custom_query_range(
                query=query,
                start_time=datetime.fromtimestamp(start_s, UTC),
                end_time=datetime.fromtimestamp(end_s, UTC),
                step=f"{max(1, int(step_s))}s",
            )
        except Exception as exc:
            log.warning("history query failed: %s", exc)
            return []
        if not result:
            return []
        out = []
        for t, v in result[0].get("values", []):
            value = float(v)
            if math.isfinite(value):
                out.append((float(t), value))
        return out
