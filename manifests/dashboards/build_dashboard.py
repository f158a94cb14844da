"""Builds the Preheat Grafana dashboard (manifests/dashboards/preheat.json) from a short panel list.

Written as code rather than by hand so every panel follows the same conventions (one Prometheus
datasource variable, per-endpoint selectors, units) and so the Helm chart's copy is regenerated in the
same step. Run: .venv/bin/python manifests/dashboards/build_dashboard.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "preheat.json"
CHART_COPY = HERE.parent / "chart" / "preheat" / "files" / "preheat.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
# Operator series carry namespace/endpoint of the InferenceEndpoint; model-server series get the same
# two target labels from the scrape config, so one selector serves both.
SEL = 'namespace="$namespace", endpoint="$endpoint"'
# Default SLO lines drawn on the latency panels; the alert rules use the same 1 s TTFT threshold.
TTFT_SLO_SECONDS = 1.0
E2E_SLO_SECONDS = 10.0


def target(ref: str, expr: str, legend: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}


def quantiles(metric: str) -> list[dict[str, Any]]:
    refs = "ABC"
    return [
        target(
            refs[i],
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{SEL}}}[$__rate_interval])))",
            f"p{round(q * 100)}",
        )
        for i, q in enumerate((0.5, 0.9, 0.99))
    ]


def slo_line(value: float) -> dict[str, Any]:
    # A red threshold line at the SLO: Grafana draws it across the panel (thresholdsStyle "line").
    return {
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}, {"color": "red", "value": value}],
        },
        "custom": {"thresholdsStyle": {"mode": "line"}},
    }


def panel(
    pid: int,
    title: str,
    targets: list[dict[str, Any]],
    grid: tuple[int, int, int, int],
    unit: str,
    description: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    x, y, w, h = grid
    defaults: dict[str, Any] = {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 0}}
    if extra:
        defaults = {**defaults, **extra, "custom": {**defaults["custom"], **extra.get("custom", {})}}
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def panels() -> list[dict[str, Any]]:
    return [
        row(100, "Load, forecast and capacity", 0),
        panel(
            1,
            "Request rate vs forecast vs capacity",
            [
                target(
                    "A",
                    f"sum(rate(preheat:requests_received_total{{{SEL}}}[$__rate_interval]))",
                    "arrivals (req/s, model servers)",
                ),
                target("B", f"max(preheat_endpoint_signal{{{SEL}}})", "scaling signal (operator)"),
                target("C", f"max(preheat_endpoint_forecast_signal{{{SEL}}})", "forecast at now + lead time"),
                target("D", f"max(preheat_endpoint_forecast_signal_upper{{{SEL}}})", "forecast upper quantile"),
                target("E", f"max(preheat_endpoint_capacity{{{SEL}}})", "capacity (serving × target)"),
                target(
                    "F",
                    # `or vector(0)`: an endpoint without scale to zero has no activator and none arrive there
                    f"sum(rate(preheat:activator_requests_total{{{SEL}}}[$__rate_interval])) or vector(0)",
                    "arrivals at zero (req/s, activator)",
                ),
            ],
            (0, 1, 12, 9),
            "short",
            "Arrivals measured at the model servers, the signal the operator scales on, its forecast one "
            "lead time ahead (and the upper quantile it provisions for), and the serving capacity. With "
            "scale to zero, the arrivals the activator counts while no replica serves.",
        ),
        panel(
            2,
            "Serving, warm and desired replicas",
            [target("A", f"max by (kind) (preheat_endpoint_replicas{{{SEL}}})", "{{kind}}")],
            (12, 1, 12, 9),
            "short",
            "serving: replicas taking traffic; warm: loaded replicas held back for the next scale-up; "
            "desired: the Deployment's replicas; ready/starting: pod readiness.",
            {"custom": {"lineInterpolation": "stepAfter"}, "decimals": 0},
        ),
        row(101, "Latency against the SLO", 10),
        panel(
            3,
            "Time to first token (TTFT)",
            quantiles("vllm:time_to_first_token_seconds"),
            (0, 11, 8, 8),
            "s",
            f"TTFT percentiles over all serving replicas; the red line is the {TTFT_SLO_SECONDS:g} s SLO "
            "used by the burn-rate alerts.",
            slo_line(TTFT_SLO_SECONDS),
        ),
        panel(
            4,
            "End-to-end request latency",
            quantiles("vllm:e2e_request_latency_seconds"),
            (8, 11, 8, 8),
            "s",
            f"Request latency from arrival to last token; the red line is a {E2E_SLO_SECONDS:g} s objective.",
            slo_line(E2E_SLO_SECONDS),
        ),
        panel(
            5,
            "Inter-token latency",
            quantiles("vllm:inter_token_latency_seconds"),
            (16, 11, 8, 8),
            "s",
            "Time between generated tokens: rises when a replica's batch is too full.",
        ),
        row(102, "Serving replicas", 19),
        panel(
            6,
            "Queue depth",
            [
                target("A", f"sum(vllm:num_requests_waiting{{{SEL}}})", "waiting"),
                target("B", f"sum(vllm:num_requests_running{{{SEL}}})", "running"),
                target("C", f"sum(preheat:activator_requests_waiting{{{SEL}}}) or vector(0)", "held by the activator"),
            ],
            (0, 20, 8, 8),
            "short",
            "Requests waiting for a batch slot (queue depth) and requests being decoded, over all replicas; "
            "with scale to zero, requests the activator holds until a replica serves.",
        ),
        panel(
            7,
            "KV-cache usage",
            [target("A", f"max by (pod, role) (vllm:kv_cache_usage_perc{{{SEL}}})", "{{pod}} ({{role}})")],
            (8, 20, 8, 8),
            "percentunit",
            "Share of each replica's KV blocks in use. Near 100 % the scheduler preempts sequences.",
            {"max": 1, "min": 0},
        ),
        panel(
            8,
            "Cold starts",
            [
                target("A", f"max by (pod) (preheat:model_load_seconds{{{SEL}}})", "model load {{pod}}"),
                target(
                    "B",
                    f"max(preheat_endpoint_cold_start_seconds{{{SEL}}})",
                    "cold start p90 (pod created → Ready)",
                ),
                target("C", f"max(preheat_endpoint_lead_time_seconds{{{SEL}}})", "lead time"),
            ],
            (16, 20, 8, 8),
            "s",
            "Model load time per replica, the p90 cold start the operator measures, and the lead time it "
            "forecasts ahead by (cold start p90 + decision interval).",
        ),
        row(103, "Autoscaler", 28),
        panel(
            9,
            "Forecast error",
            [
                target(
                    "A",
                    f"max(preheat_endpoint_forecast_error_ratio{{{SEL}}})",
                    "|forecast − actual| / actual",
                )
            ],
            (0, 29, 8, 8),
            "percentunit",
            "Error of the forecast made one lead time ago against what arrived. Alerts above 50 %.",
            slo_line(0.5),
        ),
        panel(
            10,
            "Decisions by reason",
            [
                target(
                    "A",
                    f"sum by (reason) (increase(preheat_decisions_total{{{SEL}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            (8, 29, 8, 8),
            "short",
            "Which term of the policy set the replica count (forecast, reactive floor, queue, minimum, ...).",
        ),
        panel(
            11,
            "Prefix-cache hit ratio",
            [
                target(
                    "A",
                    f"sum(rate(vllm:prefix_cache_hits_total{{{SEL}}}[$__rate_interval])) / "
                    f"sum(rate(vllm:prefix_cache_queries_total{{{SEL}}}[$__rate_interval]))",
                    "prefix-cache hits / queries",
                )
            ],
            (16, 29, 8, 8),
            "percentunit",
            "Share of prompt KV blocks found in the prefix cache.",
            {"max": 1, "min": 0},
        ),
    ]


def annotations() -> list[dict[str, Any]]:
    def ann(name: str, expr: str, color: str, title: str) -> dict[str, Any]:
        return {
            "name": name,
            "datasource": DS,
            "enable": True,
            "iconColor": color,
            "expr": expr,
            "step": "30s",
            "titleFormat": title,
            "tagKeys": "namespace,endpoint",
            "useValueForTime": False,
        }

    return [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        ann(
            "Scale events",
            f"sum by (namespace, endpoint, direction) (increase(preheat_scale_actions_total{{{SEL}}}[1m])) > 0",
            "orange",
            "scale {{direction}}",
        ),
        ann(
            "Warm → serving promotions",
            f"sum by (namespace, endpoint) (increase(preheat_promotions_total{{{SEL}}}[1m])) > 0",
            "green",
            "promotion",
        ),
    ]


def variables() -> list[dict[str, Any]]:
    def query_var(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "definition": query,
            "query": {"query": query, "refId": f"{name}-var"},
            "refresh": 2,
            "sort": 1,
            "includeAll": False,
            "multi": False,
            "current": {},
        }

    return [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
        },
        query_var("namespace", "Namespace", "label_values(preheat_endpoint_replicas, namespace)"),
        query_var(
            "endpoint",
            "Endpoint",
            'label_values(preheat_endpoint_replicas{namespace="$namespace"}, endpoint)',
        ),
    ]


def dashboard() -> dict[str, Any]:
    return {
        "uid": "preheat-endpoint",
        "title": "Preheat / Inference endpoint",
        "description": "Predictive autoscaling of one InferenceEndpoint: load, forecast, warm pool, latency.",
        "tags": ["preheat", "inference", "autoscaling"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables()},
        "annotations": {"list": annotations()},
        "panels": panels(),
        "links": [],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    text = render()
    OUT.write_text(text, encoding="utf-8")
    CHART_COPY.parent.mkdir(parents=True, exist_ok=True)
    CHART_COPY.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} and {CHART_COPY}")


if __name__ == "__main__":
    main()
