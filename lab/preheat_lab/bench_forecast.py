"""Forecast-accuracy benchmark on the ServeGen request-rate series.

`python -m preheat_lab.bench_forecast --out bench-results/forecast.json` (the `make bench-forecast`
target; the ServeGen CSVs from --traces, default $PREHEAT_TRACES or ../shared/traces from the repository root). For every series and method it walks the series once, in order, as the operator would:
update with the window's rate, then forecast 10 and 60 minutes ahead; it reports sMAPE against what
actually came, the upper-quantile forecast's coverage, and the per-sample cost of each online
forecaster. statsmodels' ExponentialSmoothing is the offline baseline: refitted (parameters
optimised) once a day on the trailing history and re-run with those parameters at every step.
Needs statsmodels (the `dev` extra) only for that baseline.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from preheat.scaling.forecast import DAY_S, Forecaster, make_forecaster
from preheat_server.hardware import machine_record

STEP_S = 600.0  # ServeGen windows
HORIZONS = {"10m": 1, "60m": 6}  # in windows
SERIES = {
    # name: (file, zeros are missing data, evaluate from this many seconds in)
    "m-small": ("servegen_m-small_10min.csv", True, 2 * DAY_S),
    "m-mid": ("servegen_m-mid_10min.csv", True, 2 * DAY_S),
    "deepseek-r1": ("servegen_deepseek-r1_10min.csv", True, 2 * 3600.0),
}


def default_traces_dir() -> Path:
    return Path(os.environ.get("PREHEAT_TRACES", "../shared/traces"))


def load_series(path: Path, zeros_missing: bool) -> tuple[list[float], list[float | None]]:
    """(times, rates) from a ServeGen CSV; all-zero windows become None when they are logging gaps."""
    times: list[float] = []
    values: list[float | None] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            t = float(row["t_s"])
            v = float(row["total_rate_rps"])
            times.append(t)
            values.append(None if (zeros_missing and v == 0.0) or not math.isfinite(v) else v)
    return times, values


def smape(pairs: list[tuple[float, float]]) -> float:
    """Symmetric MAPE in percent (0 when forecast and actual are both zero)."""
    total = 0.0
    for f, a in pairs:
        denom = abs(f) + abs(a)
        total += 0.0 if denom == 0 else 2.0 * abs(f - a) / denom
    return 100.0 * total / len(pairs) if pairs else math.nan


def run_online(
    make: Callable[[], Forecaster], times: list[float], values: list[float | None], eval_from_s: float,
    quantile: float = 0.9,
) -> dict[str, Any]:
    """Walk the series once with an online forecaster; score forecasts whose target is in the eval period."""
    model = make()
    preds: dict[str, dict[int, tuple[float, float]]] = {k: {} for k in HORIZONS}
    cost_s = 0.0
    for i, (t, v) in enumerate(zip(times, values, strict=True)):
        t0 = time.perf_counter()
        model.update(t, v)
        cost_s += time.perf_counter() - t0
        for name, k in HORIZONS.items():
            j = i + k
            if j < len(times):
                p = model.forecast(t, times[j] - t)
                u = model.forecast_upper(t, times[j] - t, quantile)
                if p is not None:
                    preds[name][j] = (p, u if u is not None else p)
    return _score(preds, times, values, eval_from_s) | {"update_us": 1e6 * cost_s / len(times)}


def _score(preds: dict[str, dict[int, tuple[float, float]]], times: list[float], values: list[float | None],
           eval_from_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, by_target in preds.items():
        pairs, covered, margins = [], 0, []
        for j, (p, u) in by_target.items():
            a = values[j]
            if a is None or times[j] < eval_from_s:
                continue
            pairs.append((p, a))
            covered += a <= u
            if p > 0:
                margins.append((u - p) / p)
        out[f"smape_{name}"] = smape(pairs)
        out[f"coverage_{name}"] = covered / len(pairs) if pairs else math.nan
        out[f"mean_margin_{name}"] = sum(margins) / len(margins) if margins else math.nan
        out[f"n_{name}"] = len(pairs)
    return out


def run_statsmodels(times: list[float], values: list[float | None], eval_from_s: float,
                    history_days: float = 7.0, filter_days: float = 3.0) -> dict[str, Any]:
    """ExponentialSmoothing (additive damped trend, additive daily season once two seasons exist).

    Missing windows are filled by linear interpolation (the model cannot take gaps). Parameters are
    optimised once a day on the trailing `history_days` (hourly before two seasons of history
    exist, when the model has no seasonal term); every step re-runs statsmodels' filter
    with them on the trailing `filter_days` (>= 2 seasons), so each forecast sees every sample so far.
    """
    from statsmodels.tools.sm_exceptions import ConvergenceWarning
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    season = int(DAY_S / STEP_S)
    filled = _interpolate(values)
    preds: dict[str, dict[int, tuple[float, float]]] = {k: {} for k in HORIZONS}
    params: dict[str, Any] | None = None
    params_seasonal = False
    last_fit = -(10**9)
    max_h = max(HORIZONS.values())
    fits = 0
    t0 = time.perf_counter()
    for i in range(len(times)):
        if filled[i] is None:
            continue
        # daily once seasonal; hourly while history is short (parameters from a few hours are poor)
        refit = params is None or i - last_fit >= (season if params_seasonal else 6)
        days = history_days if refit else filter_days
        lo = max(0, i + 1 - int(days * season))
        window = [v for v in filled[lo : i + 1] if v is not None]
        if len(window) < 12:
            continue
        seasonal = len(window) >= 2 * season
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", UserWarning)
            model = ExponentialSmoothing(
                window,
                trend="add",
                damped_trend=True,
                seasonal="add" if seasonal else None,
                seasonal_periods=season if seasonal else None,
                initialization_method="estimated",
            )
            if refit or seasonal != params_seasonal:
                fit = model.fit(optimized=True)
                params = {k: fit.params[k] for k in ("smoothing_level", "smoothing_trend", "damping_trend")}
                if seasonal:
                    params["smoothing_seasonal"] = fit.params["smoothing_seasonal"]
                params_seasonal, last_fit = seasonal, i
                fits += 1
            else:
                fit = model.fit(optimized=False, **params)
            fc = fit.forecast(max_h)
        for name, k in HORIZONS.items():
            j = i + k
            if j < len(times):
                p = max(0.0, float(fc[k - 1]))
                preds[name][j] = (p, p)
    elapsed = time.perf_counter() - t0
    out = _score(preds, times, values, eval_from_s)
    return {k: v for k, v in out.items() if not k.startswith(("coverage", "mean_margin"))} | {
        "fits": fits, "seconds": elapsed}


def _interpolate(values: list[float | None]) -> list[float | None]:
    out: list[float | None] = list(values)
    known = [i for i, v in enumerate(values) if v is not None]
    for a, b in itertools.pairwise(known):
        va, vb = values[a], values[b]
        assert va is not None and vb is not None
        for i in range(a + 1, b):
            out[i] = va + (vb - va) * (i - a) / (b - a)
    return out


def methods() -> dict[str, Callable[[], Forecaster]]:
    """The online forecasters compared, all fed 600 s windows."""
    return {
        "persistence": lambda: make_forecaster("persistence", step_s=STEP_S),
        "seasonal-naive": lambda: make_forecaster("seasonal-naive", step_s=STEP_S),
        "preheat-trend": lambda: make_forecaster("trend", step_s=STEP_S),
        "preheat-holt-winters": lambda: make_forecaster("holt-winters", step_s=STEP_S),
        "preheat-holt-winters-weekly": lambda: make_forecaster("holt-winters", step_s=STEP_S, weekly=True),
        "preheat-auto": lambda: make_forecaster("auto", step_s=STEP_S),
    }


def run(traces: Path, with_statsmodels: bool = True) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (file, zeros_missing, eval_from) in SERIES.items():
        path = traces / file
        if not path.exists():
            results[name] = {"error": f"{path} not found"}
            continue
        times, values = load_series(path, zeros_missing)
        series: dict[str, Any] = {
            "windows": len(times),
            "missing_windows": sum(v is None for v in values),
            "eval_from_s": eval_from,
            "methods": {},
        }
        for method, make in methods().items():
            series["methods"][method] = run_online(make, times, values, eval_from)
        if with_statsmodels:
            series["methods"]["statsmodels-ets"] = run_statsmodels(times, values, eval_from)
        results[name] = series
        print(f"{name}: done", file=sys.stderr)
    return results


def markdown_table(results: dict[str, Any]) -> str:
    names = [n for n in results if "methods" in results[n]]
    all_methods: list[str] = []
    for n in names:
        for m in results[n]["methods"]:
            if m not in all_methods:
                all_methods.append(m)
    head = "| method | " + " | ".join(f"{n} 10 min | {n} 60 min" for n in names) + " |"
    sep = "|---|" + "---:|---:|" * len(names)
    rows = [head, sep]
    for m in all_methods:
        cells = []
        for n in names:
            r = results[n]["methods"].get(m, {})
            cells += [f"{r.get('smape_10m', math.nan):.1f}", f"{r.get('smape_60m', math.nan):.1f}"]
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preheat_lab.bench_forecast", description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=default_traces_dir(), help="folder with the ServeGen CSVs")
    parser.add_argument("--out", type=Path, default=Path("bench-results/forecast.json"))
    parser.add_argument("--no-statsmodels", action="store_true", help="skip the offline baseline")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"error: traces folder {args.traces} does not exist (set --traces or PREHEAT_TRACES)", file=sys.stderr)
        return 2
    started = time.time()
    results = run(args.traces, with_statsmodels=not args.no_statsmodels)
    doc = {
        "benchmark": "forecast accuracy (sMAPE %, lower is better) on ServeGen 10-minute request-rate series",
        "command": "python -m preheat_lab.bench_forecast --out " + str(args.out),
        "horizons": {k: v * STEP_S for k, v in HORIZONS.items()},
        "notes": "all-zero windows are missing data (not scored, not fed); evaluation starts at eval_from_s; "
        "coverage = share of actuals <= the 0.9 upper forecast",
        "python": platform.python_version(),
        "machine": machine_record(),
        "wall_s": round(time.time() - started, 2),
        "series": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, allow_nan=True))
    print(markdown_table(results))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
