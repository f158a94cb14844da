"""What the operator keeps for one endpoint between steps, each piece once: its Autoscaler (forecaster +
policy, built from the spec), the cold-start window, the forecasts waiting to be scored, and the
loop's bookkeeping. All of it can be rebuilt from the cluster: a restarted operator restores the
autoscaler from `.status.forecaster` or replays Prometheus history, and re-reads cold starts from pods.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from preheat.controller.spec import InferenceEndpointSpec
from preheat.scaling.autoscaler import Autoscaler
from preheat.scaling.from_spec import autoscaler_from_spec, forecasting_key, restore_autoscaler
from preheat.scaling.policy import PolicyConfig

log = logging.getLogger("preheat.endpoint")

COLD_START_WINDOW = 50  # pods whose creation -> Ready time feeds the planned cold start


@dataclass
class ColdStartWindow:
    """Creation -> Ready seconds of the last COLD_START_WINDOW pods, each counted the first time it is
    seen Ready (a pod stays Ready for many steps; it paid one cold start)."""

    by_pod: dict[str, float] = field(default_factory=dict)

    def add(self, seen: dict[str, float]) -> tuple[float, ...]:
        for pod, seconds in seen.items():
            if pod not in self.by_pod:
                self.by_pod[pod] = seconds
                while len(self.by_pod) > COLD_START_WINDOW:
                    self.by_pod.pop(next(iter(self.by_pod)))
        return self.samples

    @property
    def samples(self) -> tuple[float, ...]:
        return tuple(self.by_pod.values())


@dataclass
class ForecastScore:
    """Forecasts made one lead time ago, scored against the signal that arrived: |forecast - actual| /
    actual, the `preheat_endpoint_forecast_error_ratio` metric."""

    pending: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=512))

    def score(self, now_s: float, signal: float) -> float | None:
        """The error of the latest forecast that came due (None when none did, or the signal is 0)."""
        error = None
        while self.pending and self.pending[0][0] <= now_s:
            _, predicted = self.pending.popleft()
            if signal > 0:
                error = abs(predicted - signal) / signal
        return error

    def add(self, due_s: float, forecast: float) -> None:
        self.pending.append((due_s, forecast))


@dataclass
class Endpoint:
    """One endpoint's state in the operator (one per InferenceEndpoint this replica handles)."""

    autoscaler: Autoscaler | None = None
    key: dict[str, Any] | None = None  # forecasting_key the autoscaler's forecaster was built for
    cold_starts: ColdStartWindow = field(default_factory=ColdStartWindow)
    forecasts: ForecastScore = field(default_factory=ForecastScore)
    metrics_failures: int = 0
    last_persist_s: float = 0.0
    last_failure_event: str = ""
    last_reason: str = ""
    activator_blocked: bool = False  # scale to zero held back by an activator that is not Ready
    history_seeded: bool = False
    rebuild_handled: str | None = None
    seeded: dict[str, Any] = field(default_factory=dict)

    def forget_forecaster(self) -> None:
        """A rebuild was asked for: a fresh forecaster, seeded from Prometheus history."""
        self.autoscaler, self.key, self.history_seeded = None, None, False

    def autoscaler_for(self, spec: InferenceEndpointSpec, config: PolicyConfig,
                       saved: str | dict[str, Any] | None, where: str) -> Autoscaler:
        """The autoscaler for this spec: kept while the spec asks for the same thing, kept with a new
        policy configuration when only that changed, restored from `saved` (status.forecaster) on the
        first step, rebuilt (and seeded again from Prometheus) when the forecasting settings changed."""
        key = forecasting_key(spec, config.decision_interval_s)
        a = self.autoscaler
        if a is not None and self.key == key:
            if a.config != config:  # spec change: new policy configuration, same forecaster
                self.autoscaler = autoscaler_from_spec(spec, config, a.forecaster)
        elif a is not None:
            # The forecaster's own settings changed (model, season, clock, signal, step): what it
            # learned does not apply; rebuild it from the signal's history in Prometheus.
            log.info("forecasting settings of %s changed: rebuilding the forecaster from Prometheus", where)
            self.autoscaler, self.history_seeded = autoscaler_from_spec(spec, config), False
        else:
            self.autoscaler = self._restored(saved, config, spec, where) if saved else None
            self.history_seeded = self.autoscaler is not None
            if self.autoscaler is None:
                self.autoscaler = autoscaler_from_spec(spec, config)
        self.key = key
        return self.autoscaler

    @staticmethod
    def _restored(saved: str | dict[str, Any], config: PolicyConfig, spec: InferenceEndpointSpec,
                  where: str) -> Autoscaler | None:
        try:
            autoscaler = restore_autoscaler(json.loads(saved) if isinstance(saved, str) else saved, config, spec)
        except Exception as exc:  # a newer/older format: rebuild from Prometheus instead
            log.warning("cannot restore forecaster state for %s: %s", where, exc)
            return None
        log.info("restored forecaster state for %s from status", where)
        return autoscaler
