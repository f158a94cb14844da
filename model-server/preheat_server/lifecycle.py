"""The server's life: loading -> ready -> draining, and the cold start it measures on the way.

Readiness is honest: the server binds its port first (liveness answers 200), loads and warms up the
model while readiness answers 503, and becomes ready only after one warm-up request went through.
The cold start is measured from the process's start (as the kernel recorded it, so interpreter and
import time count) to ready, because that is what a new replica costs the autoscaler. Where an init
container downloaded the weights first (`preheat-fetch`, its record named by $PREHEAT_FETCH_RECORD),
that download happened before this process and is added: cold start = download + load.
"""

from __future__ import annotations

import logging
import os
import time

from preheat_server.fetch import recorded_download_seconds
from preheat_server.metrics import ServerMetrics

log = logging.getLogger(__name__)

STATES = ("loading", "ready", "draining")


def process_start_time() -> float:
    """Unix time the process started, from /proc (Linux); falls back to now elsewhere.

    /proc/PID/stat gives the start in clock ticks on the boot-time clock. It is turned into an age on
    that same clock and subtracted from now, not added to /proc/stat's ``btime``: btime is whole seconds
    and drifts from the wall clock (NTP steps, VM snapshot restores); on the benchmark VM it put the
    start 0.9 s too early, so the exported cold start read 0.9 s longer than a client saw it.
    """
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            # Field 22 (starttime, clock ticks after boot); the command name in field 2 may hold spaces.
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
    return time.time() - max(0.0, age)


class Lifecycle:
    """Current state plus the cold-start measurement; every change is exported as a metric."""

    def __init__(self, metrics: ServerMetrics, started_at: float | None = None,
                 download_seconds: float | None = None) -> None:
        self._metrics = metrics
        self.started_at = process_start_time() if started_at is None else started_at
        # None: read the init container's fetch record, if the pod has one.
        self.download_seconds = recorded_download_seconds() if download_seconds is None else download_seconds
        metrics.model_download_seconds.labels(metrics.model_name).set(self.download_seconds or 0.0)
        self.state = "loading"
        self.cold_start_seconds: float | None = None
        metrics.set_state("loading")

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def mark_ready(self) -> float:
        """Loading and warm-up are done: record the cold start and start serving."""
        if self.state != "loading":
            return self.cold_start_seconds or 0.0
        self.cold_start_seconds = max(0.0, time.time() - self.started_at) + (self.download_seconds or 0.0)
        self._metrics.model_load_seconds.labels(self._metrics.model_name).set(self.cold_start_seconds)
        self.state = "ready"
        self._metrics.set_state("ready")
        log.info("ready: cold start %.2f s (download %.2f s)", self.cold_start_seconds, self.download_seconds or 0.0)
        return self.cold_start_seconds

    def begin_drain(self) -> None:
        """From now on readiness answers 503 and new inference requests are refused."""
        if self.state != "draining":
            self.state = "draining"
            self._metrics.set_state("draining")
            log.info("draining: readiness is now 503")
