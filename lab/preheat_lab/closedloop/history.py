"""The endpoint's past, in Prometheus: the trace before the replayed slice, as the pods would have recorded it.

A production operator starts with days of an endpoint's request rate in Prometheus and rebuilds its
forecaster from them (`preheat.controller.collect.history`: two seasons of `query_range`). A closed-loop run
creates its endpoint minutes before the replay, so Prometheus has no past for it. This module writes
that past: the arrivals counter `preheat:requests_received_total{namespace, endpoint}` of the trace's
preceding hours (the previous day, time-compressed and rate-scaled exactly like the replay), as a TSDB
block made by `promtool tsdb create-blocks-from openmetrics` and dropped into Prometheus' data
directory. Prometheus loads new blocks on its block-reload timer (once a minute, see
prometheus/tsdb/db.go `DB.run`), so `ReloadWatch` learns that timer's phase from Prometheus' own
`prometheus_tsdb_reloads_total` and the run starts its replay just after the reload that loads the
block: the history then ends exactly where the replay begins, with no gap and no zeros between them.

Nothing here touches the operator: it reads the history through its ordinary Prometheus queries.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

METRIC = "preheat:requests_received_total"
RELOADS = re.compile(r"^prometheus_tsdb_reloads_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.MULTILINE)
RELOAD_PERIOD_S = 60.0  # Prometheus' default block reload interval


@dataclass(frozen=True)
class TraceClock:
    """Wall time <-> trace time of one run: the replay starts at `t0_wall`, playing `t0_trace`."""

    t0_wall: float
    t0_trace: float
    compress: float

    def trace(self, wall_s: float) -> float:
        return self.t0_trace + (wall_s - self.t0_wall) * self.compress

    def wall(self, trace_s: float) -> float:
        return self.t0_wall + (trace_s - self.t0_trace) / self.compress


def rate_function(times_s: np.ndarray, rates_rps: np.ndarray, window_s: float | None,
                  rate_scale: float) -> Callable[[np.ndarray], np.ndarray]:
    """The replayed rate at trace time t: linear between window centres, times `rate_scale` (the same
    rule as `preheat_lab.loadgen.schedule.from_rate_series`, so the history continues the replay)."""
    t = np.asarray(times_s, dtype=float)
    r = np.asarray(rates_rps, dtype=float)
    ok = np.isfinite(r) & (r >= 0)
    t, r = t[ok], r[ok]
    if window_s is None:
        window_s = float(np.median(np.diff(t))) if t.size > 1 else 600.0
    centres = t + window_s / 2

    def rate(trace_s: np.ndarray) -> np.ndarray:
        return np.interp(trace_s, centres, r) * rate_scale

    return rate


def counter_samples(rate: Callable[[np.ndarray], np.ndarray], clock: TraceClock, start_trace_s: float,
                    end_wall_s: float, step_wall_s: float = 2.5) -> list[tuple[float, float]]:
    """(wall time, counter value) of the arrivals counter from `start_trace_s` to `end_wall_s`: the
    expected arrivals (the integral of the replayed rate over wall time), sampled every `step_wall_s`
    (a scrape interval), so `rate(...[20s])` over it gives the replayed rate."""
    start_w = clock.wall(start_trace_s)
    if end_wall_s <= start_w:
        return []
    fine = np.arange(start_w, end_wall_s + 1e-9, 0.25)
    r = rate(np.array([clock.trace(w) for w in fine]))
    cum = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(fine))])
    ts = np.arange(start_w, end_wall_s + 1e-9, step_wall_s)
    return [(float(t), float(v)) for t, v in zip(ts, np.interp(ts, fine, cum), strict=True)]


def openmetrics(labels: dict[str, str], samples: list[tuple[float, float]], metric: str = METRIC) -> str:
    """OpenMetrics text for one series (timestamps in seconds), as promtool's backfill reads it."""
    lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    lines = [f"{metric}{{{lab}}} {v:.6f} {t:.3f}" for t, v in samples]
    return "\n".join(lines) + "\n# EOF\n"


def write_block(promtool: Path, data_dir: Path, text: str) -> list[str]:
    """Turn OpenMetrics text into TSDB block(s) and move them into Prometheus' data directory.

    The blocks are built next to the data directory (same filesystem) and renamed into it, so
    Prometheus never sees half a block. Returns the block ULIDs."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"no Prometheus data directory at {data_dir}")
    tmp = Path(tempfile.mkdtemp(prefix=".preheat-backfill-", dir=data_dir.parent))
    try:
        src = tmp / "history.om"
        src.write_text(text)
        out = tmp / "blocks"
        proc = subprocess.run([str(promtool), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(src),
                               str(out)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"promtool create-blocks-from failed ({proc.returncode}): {proc.stderr.strip()}")
        ulids = sorted(p.name for p in out.iterdir() if p.is_dir())
        if not ulids:
            raise RuntimeError("promtool wrote no block")
        for u in ulids:
            os.rename(out / u, data_dir / u)
        return ulids
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ReloadWatch:
    """Learns when Prometheus reloads its TSDB blocks, from its own `prometheus_tsdb_reloads_total`.

    Polls `<prometheus>/metrics` in a thread; `next_reload(after)` predicts the first reload after
    `after` from the last one seen and the observed period (60 s until two are seen)."""

    def __init__(self, prometheus_url: str, poll_s: float = 0.5) -> None:
        self.url = prometheus_url.rstrip("/") + "/metrics"
        self.poll_s = poll_s
        self.reloads: list[float] = []
        self._last: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> float | None:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as r:
                m = RELOADS.search(r.read().decode(errors="replace"))
        except Exception:
            return None
        return float(m.group(1)) if m else None

    def _run(self) -> None:
        while not self._stop.is_set():
            t_before = time.time()
            v = self._read()
            if v is not None:
                if self._last is not None and v > self._last:
                    self.reloads.append(t_before)  # the reload happened within the last poll period
                self._last = v
            self._stop.wait(self.poll_s)

    def start(self) -> ReloadWatch:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="prometheus-reload-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def period(self) -> float:
        gaps = [b - a for a, b in zip(self.reloads, self.reloads[1:], strict=False) if 30 < b - a < 120]
        return statistics.median(gaps) if gaps else RELOAD_PERIOD_S

    def next_reload(self, after: float) -> float | None:
        """The first predicted reload after `after`; None until one reload has been seen."""
        if not self.reloads:
            return None
        last, period = self.reloads[-1], self.period()
        n = max(0, int((after - last) // period) + 1)
        return last + n * period


def history_visible(prometheus_url: str, namespace: str, endpoint: str, start_s: float, end_s: float) -> int:
    """How many points of the endpoint's arrivals rate Prometheus returns over [start, end] (0: none yet)."""
    q = f'sum(rate({METRIC}{{namespace="{namespace}",endpoint="{endpoint}"}}[20s]))'
    params = urllib.parse.urlencode({"query": q, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": "5"})
    try:
        with urllib.request.urlopen(f"{prometheus_url.rstrip('/')}/api/v1/query_range?{params}", timeout=10) as r:
            import json

            data = json.loads(r.read())
    except Exception as e:
        log.debug("history query failed: %s", e)
        return 0
    result = (data.get("data") or {}).get("result") or []
    return len(result[0].get("values", [])) if result else 0


@dataclass
class HistoryWriter:
    """Writes an endpoint's past into the local cluster's Prometheus (promtool + its data directory)."""

    promtool: Path
    data_dir: Path
    prometheus_url: str

    def write(self, namespace: str, endpoint: str, rate: Callable[[np.ndarray], np.ndarray], clock: TraceClock,
              start_trace_s: float) -> dict:
        """The counter from `start_trace_s` up to the replay's start (`clock.t0_wall`); returns a summary."""
        samples = counter_samples(rate, clock, start_trace_s, clock.t0_wall)
        labels = {"namespace": namespace, "endpoint": endpoint, "pod": "history", "job": "closedloop-history",
                  "instance": "history"}
        ulids = write_block(self.promtool, self.data_dir, openmetrics(labels, samples))
        return {"blocks": ulids, "samples": len(samples), "start_trace_s": start_trace_s,
                "end_trace_s": clock.t0_trace, "start_wall_s": samples[0][0] if samples else None,
                "end_wall_s": samples[-1][0] if samples else None,
                "requests": samples[-1][1] if samples else 0.0}
