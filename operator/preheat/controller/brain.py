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
from preheat.forecast import Forecaster, make_forecaster
from preheat.policy import Autoscaler, Decision, Observation, PolicyConfig

log = logging.getLogger("preheat.brain")


def policy_config(spec: InferenceEndpointSpec, reactive_only: bool = False,
                  interval_s: float | None = None) -> PolicyConfig:
    """The policy's configuration for one endpoint. Reactive-only disables forecasts and the warm pool;
    `interval_s` is the operator's --interval override of the decision interval."""
    s = spec.scaling
    stable = duration_s(spec.prometheus.window)
    panic = min(duration_s(spec.prometheus.panic_window), stable)
    return PolicyConfig(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        target_per_replica=s.target_per_replica,
        decision_interval_s=interval_s or s.interval_seconds,
        forecasting=s.forecasting.enabled and not reactive_only,
        horizon_override_s=s.forecasting.horizon_seconds,
        stable_window_s=stable,
        panic_window_s=panic,
        scale_down_stabilization_s=float(s.scale_down_stabilization_seconds),
        warm_pool_min=0 if reactive_only else s.warm_pool.min,
        warm_pool_max=0 if reactive_only else s.warm_pool.max,
        scale_to_zero=s.scale_to_zero,
        # A replica's slots: lets the policy see a burst in the queue before the rate window does
        # (it promotes warm replicas at once; cold starts still follow the rate and the forecast).
        concurrency_per_replica=float(spec.server.max_num_seqs) if spec.server.max_num_seqs else None,
    )


def make_brain_forecaster(spec: InferenceEndpointSpec, step_s: float) -> Forecaster:
    f = spec.scaling.forecasting
    kwargs: dict[str, Any] = {"step_s": step_s}
    if f.seasonality_seconds:
        kwargs["season_s"] = float(f.seasonality_seconds)
    return make_forecaster(f.forecaster or "auto", **kwargs)


class Brain:
    """Forecaster + policy for one endpoint: `preheat.policy.Autoscaler`, built from the spec."""

    def __init__(self, config: PolicyConfig, spec: InferenceEndpointSpec, forecaster: Forecaster | None = None,
                 autoscaler: Autoscaler | None = None) -> None:
        self.config = config
        if autoscaler is None:
            forecaster = forecaster or make_brain_forecaster(spec, config.decision_interval_s)
            autoscaler = Autoscaler(config, forecaster)
        self.autoscaler = autoscaler

    @property
    def forecaster(self) -> Forecaster:
        return self.autoscaler.forecaster

    @property
    def forecast_ready(self) -> bool:
        return bool(getattr(self.forecaster, "ready", False))

    def seed(self, samples: list[tuple[float, float]]) -> int:
        """Replay history (time, value) into the forecaster; returns how many samples went in."""
        for t, v in samples:
            self.forecaster.update(t, v)
        return len(samples)

    def step(self, obs: Observation) -> Decision:
        return self.autoscaler.step(obs)

    def to_dict(self) -> dict[str, Any]:
        """State worth persisting across an operator restart."""
        return {"autoscaler": self.autoscaler.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: PolicyConfig, spec: InferenceEndpointSpec) -> Brain:
        """Restore persisted state under the current spec's config; raises if the format is unknown."""
        return cls(config, spec, autoscaler=Autoscaler.from_dict(data["autoscaler"], config))
