"""Draws the Grafana dashboard's panels as a PNG from a live Prometheus, without Grafana.

Every panel's queries are run exactly as Grafana would (variables substituted) over a time range and
drawn with matplotlib in the dashboard's grid order: a picture of what users see, from real data.

    .venv/bin/python manifests/dashboards/render_png.py --prometheus http://127.0.0.1:9090 \
        --namespace default --endpoint tiny-cpu --minutes 15 --out dashboard.png
"""

from __future__ import annotations

import argparse
import json
import math
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
UNIT_LABEL = {"s": "seconds", "percentunit": "share", "short": ""}


def substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def query_range(url: str, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    qs = urllib.parse.urlencode(
        {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{qs}", timeout=15) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus rejected {promql!r}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def series_points(values: list[list[Any]]) -> tuple[list[datetime], list[float], int]:
    """(times, values, how many values are finite) of one query_range series; Prometheus writes NaN and
    ±Inf as strings, which float() reads."""
    xs = [datetime.fromtimestamp(float(ts)) for ts, _ in values]
    ys = [float(v) for _, v in values]
    return xs, ys, sum(1 for y in ys if math.isfinite(y))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p.get("type") == "timeseries"]


def render(
    dashboard: dict[str, Any],
    prometheus: str,
    values: dict[str, str],
    start: float,
    end: float,
    out: Path,
    step: float = 5.0,
) -> dict[str, int]:
    """Write the PNG; return series drawn per panel title (a series with no finite value is not drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    ps = panels(dashboard)
    cols = 3
    rows = math.ceil(len(ps) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.3 * rows), squeeze=False)
    drawn: dict[str, int] = {}
    for ax, p in zip(axes.flat, ps, strict=False):
        n = 0
        for t in p["targets"]:
            for s in query_range(prometheus, substitute(t["expr"], values), start, end, step):
                xs, ys, finite = series_points(s["values"])
                if not finite:
                    continue  # NaN or ±Inf only: Grafana draws nothing, and neither do we
                # A sample or two is a point, not a line: mark it (Grafana's "show points: auto").
                ax.plot(xs, ys, linewidth=1.2, marker="o" if finite < 3 else None, markersize=3,
                        label=legend(t.get("legendFormat", ""), s["metric"]) or t["refId"])
                n += 1
        steps = p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        for st in steps:
            if st.get("value") is not None and st.get("color") == "red":
                ax.axhline(st["value"], color="red", linestyle="--", linewidth=1, label="SLO / limit")
        ax.set_title(p["title"], fontsize=10)
        ax.set_ylabel(UNIT_LABEL.get(p["fieldConfig"]["defaults"].get("unit", ""), ""), fontsize=8)
        # Every panel spans the dashboard's time range, as in Grafana (not each series' own span).
        ax.set_xlim(datetime.fromtimestamp(start), datetime.fromtimestamp(end))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if n:
            ax.legend(fontsize=6, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        drawn[p["title"]] = n
    for ax in list(axes.flat)[len(ps) :]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} — {values['namespace']}/{values['endpoint']}", fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--rate-interval", default="30s", help="value of Grafana's $__rate_interval")
    ap.add_argument("--dashboard", type=Path, default=HERE / "preheat.json")
    ap.add_argument("--out", type=Path, default=Path("dashboard.png"))
    args = ap.parse_args(argv)
    end = time.time()
    values = {"namespace": args.namespace, "endpoint": args.endpoint, "__rate_interval": args.rate_interval}
    drawn = render(
        json.loads(args.dashboard.read_text()),
        args.prometheus,
        values,
        end - args.minutes * 60,
        end,
        args.out,
    )
    empty = [t for t, n in drawn.items() if not n]
    print(f"wrote {args.out}: {len(drawn)} panels" + (f", no data in: {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
