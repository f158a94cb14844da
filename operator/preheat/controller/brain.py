"""The operator's handle on the scaling brain: spec -> PolicyConfig, and one Autoscaler per endpoint.

The forecaster and policy (`preheat.forecast`, `preheat.policy`) are shared with the simulator and
know nothing of Kubernetes; this module only translates the CR's spec into their configuration and
keeps the forecaster reachable so the operator can replay Prometheus history into it on start.
"""

from __future__ import annotations

import logging
from typing import Any

from preheat.controller.observe import duration_s
from preheat.controller.spec import InferenceEndpointSpec
from preheat.policy.types import Decision, Observation, PolicyConfig, PolicyState

log = logging.getLogger("preheat.brain")


def policy_config(spec: InferenceEndpointSpec, reactive_only: bool = False) -> PolicyConfig:
    """The policy's configuration for one endpoint. Reactive-only disables forecasts and the warm pool."""
    s = spec.scaling
    stable = duration_s(spec.prometheus.window)
    panic = min(duration_s(spec.prometheus.panic_window), stable)
    return PolicyConfig(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        target_per_replica=s.target_per_replica,
        decision_interval_s=s.interval_seconds,
        forecasting=s.forecasting.enabled and not reactive_only,
        horizon_override_s=s.forecasting.horizon_seconds,
        stable_window_s=stable,
        panic_window_s=panic,
        scale_down_stabilization_s=float(s.scale_down_stabilization_seconds),
        warm_pool_min=0 if reactive_only else s.warm_pool.min,
        warm_pool_max=0 if reactive_only else s.warm_pool.max,
        scale_to_zero=s.scale_to_zero,
    )


def _make_forecaster(spec: InferenceEndpointSpec) -> Any | None:
    try:
        from preheat.forecast import make_forecaster
    except ImportError:
        return None
    f = spec.scaling.forecasting
    kwargs: dict[str, Any] = {}
    if f.seasonality_seconds:
        kwargs["season_s"] = float(f.seasonality_seconds)
    name = f.forecaster
    for attempt in (
        lambda: make_forecaster(name, **kwargs) if name else make_forecaster(**kwargs),
        lambda: make_forecaster(name) if name else make_forecaster(),
    ):
        try:
            return attempt()
        except TypeError:
            continue
    return None


class Brain:
    """Forecaster + policy for one endpoint. Uses `preheat.policy.Autoscaler` when it exists; else
    calls the pure `decide` with the forecaster's peak over the lead time (the same contract)."""

    def __init__(self, config: PolicyConfig, spec: InferenceEndpointSpec, forecaster: Any | None = None) -> None:
        self.config = config
        self.forecaster = forecaster if forecaster is not None else _make_forecaster(spec)
        self._autoscaler = None
        self._state = PolicyState()
        try:
            from preheat.policy import Autoscaler

            self._autoscaler = Autoscaler(config, self.forecaster)
        except (ImportError, TypeError) as exc:
            log.debug("no preheat.policy.Autoscaler (%s): using decide() directly", exc)

    @property
    def forecast_ready(self) -> bool:
        return bool(self.forecaster is not None and getattr(self.forecaster, "ready", False))

    def seed(self, samples: list[tuple[float, float]]) -> int:
        """Replay history (time, value) into the forecaster; returns how many samples went in."""
        if self.forecaster is None:
            return 0
        for t, v in samples:
            self.forecaster.update(t, v)
        return len(samples)

    def step(self, obs: Observation) -> Decision:
        if self._autoscaler is not None:
            return self._autoscaler.step(obs)
        from preheat.policy.decide import decide, lead_time_s

        fv = fu = None
        if self.forecaster is not None and obs.value is not None and not obs.stale:
            self.forecaster.update(obs.time_s, obs.value)
        if self.forecaster is not None and self.config.forecasting:
            lead = self.config.horizon_override_s or lead_time_s(
                self.config, obs.cold_start_samples_s or self._state.cold_start_samples_s
            )
            fv = self.forecaster.forecast(obs.time_s, lead)
            fu = self.forecaster.forecast_upper(obs.time_s, lead, self.config.quantile)
        decision, self._state = decide(self.config, self._state, obs, fv, fu)
        return decision

    def to_dict(self) -> dict[str, Any] | None:
        """State worth persisting across an operator restart (None when nothing serialises)."""
        if self._autoscaler is not None and hasattr(self._autoscaler, "to_dict"):
            return {"autoscaler": self._autoscaler.to_dict()}
        out: dict[str, Any] = {"policy": self._state.to_dict()}
        if self.forecaster is not None and hasattr(self.forecaster, "to_dict"):
            out["forecaster"] = self.forecaster.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: PolicyConfig, spec: InferenceEndpointSpec) -> Brain:
        """Restore persisted state; raises (ValueError, KeyError, TypeError, ImportError) if it cannot."""
        if "autoscaler" in data:
            from preheat.policy import Autoscaler

            restored = Autoscaler.from_dict(data["autoscaler"])
            brain = cls.__new__(cls)
            brain.config = config
            brain._state = PolicyState()
            brain._autoscaler = restored
            # A spec change since the state was saved wins over the saved configuration.
            if hasattr(restored, "config") and restored.config != config:
                brain._autoscaler = Autoscaler(config, getattr(restored, "forecaster", None))
            brain.forecaster = getattr(brain._autoscaler, "forecaster", None)
            return brain
        forecaster = None
        if "forecaster" in data:
            from preheat.forecast import forecaster_from_dict

            forecaster = forecaster_from_dict(data["forecaster"])
        brain = cls(config, spec, forecaster)
        if brain._autoscaler is None and "policy" in data:
            brain._state = PolicyState.from_dict(data["policy"])
        return brain
