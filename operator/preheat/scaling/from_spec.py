"""An InferenceEndpoint spec -> its Autoscaler: the policy's configuration, the forecaster, and the
state the operator persists in `.status.forecaster`.

The one place a spec becomes an autoscaler, for both hosts: the operator (`controller/endpoint.py`)
and the simulator (`sim/preheat_policy.py`) build theirs with `autoscaler_from_spec(spec,
policy_config(spec))`. Pure: the spec is a typed pydantic object, nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from preheat.controller.spec import InferenceEndpointSpec, duration_s
from preheat.scaling.autoscaler import Autoscaler
from preheat.scaling.forecast import DAY_S, Forecaster, forecaster_from_dict, make_forecaster
from preheat.scaling.policy import PolicyConfig, PolicyState


def policy_config(spec: InferenceEndpointSpec, reactive_only: bool = False,
                  interval_s: float | None = None) -> PolicyConfig:
    """The policy's configuration for one endpoint. Reactive-only disables forecasts, the warm pool and the
    burst envelope; `interval_s` is the operator's --interval override of the decision interval."""
    s = spec.scaling
    stable = duration_s(spec.prometheus.window)
    panic = min(duration_s(spec.prometheus.panic_window), stable)
    return PolicyConfig(
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        target_per_replica=s.target_per_replica,
        target_utilization=s.target_utilization,
        decision_interval_s=interval_s or s.interval_seconds,
        forecasting=s.forecasting.enabled and not reactive_only,
        horizon_override_s=s.forecasting.lead_time_seconds,
        forecast_window_s=s.forecasting.window_seconds,
        stable_window_s=stable,
        panic_window_s=panic,
        scale_down_stabilization_s=None if s.scale_down_stabilization_seconds is None
        else float(s.scale_down_stabilization_seconds),
        warm_pool_min=0 if reactive_only else s.warm_pool.min,
        warm_pool_max=0 if reactive_only else s.warm_pool.max,
        # The burst envelope lives in the warm pool: off with it in reactive-only mode.
        burst_memory_s=0.0 if reactive_only else float(s.warm_pool.burst_memory_seconds),
        burst_threshold=s.warm_pool.burst_threshold,
        warm_cost_fraction=spec.warm_cost_fraction(),
        scale_to_zero=s.scale_to_zero,
        scale_to_zero_grace_s=float(s.scale_to_zero_grace_seconds),
        # A replica's slots: lets the policy see a burst in the queue before the rate window does
        # (it promotes warm replicas at once; cold starts still follow the rate and the forecast).
        concurrency_per_replica=float(spec.server.max_num_seqs) if spec.server.max_num_seqs else None,
    )


def autoscaler_from_spec(spec: InferenceEndpointSpec, config: PolicyConfig | None = None,
                         forecaster: Forecaster | None = None) -> Autoscaler:
    """The endpoint's autoscaler (forecaster + policy). `config` is `policy_config(spec)` unless the host
    passes its own derivation of it (the operator's --reactive-only / --interval, the simulator's fleet
    capacity and target utilization), always built from this spec's `policy_config`."""
    config = config if config is not None else policy_config(spec)
    return Autoscaler(config, forecaster or forecaster_from_spec(spec, config.decision_interval_s))


class TimeScaledForecaster:
    """A forecaster on the load's clock: times and horizons are multiplied by `scale` on the way in.

    A replay compressed 240x plays a day in 6 minutes. The forecasters' time constants (a 5-minute
    level, 30-minute season buckets, an hour of trend) are tuned for real time, so on the wall clock
    they would be 240x too slow and the daily season would fit in one bucket. Scaling the clock keeps
    every constant consistent with the load instead of re-tuning each one: the wrapped forecaster
    sees exactly the series it would see in real time (`spec.scaling.forecasting.timeCompression`).
    """

    kind = "time-scaled"

    def __init__(self, inner: Forecaster, scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"time scale must be > 0, got {scale!r}")
        self.inner, self.scale = inner, float(scale)

    @property
    def ready(self) -> bool:
        return bool(getattr(self.inner, "ready", False))

    def update(self, t_s: float, value: float | None) -> None:
        self.inner.update(t_s * self.scale, value)

    def forecast(self, t_s: float, horizon_s: float) -> float | None:
        return self.inner.forecast(t_s * self.scale, horizon_s * self.scale)

    def forecast_upper(self, t_s: float, horizon_s: float, quantile: float = 0.9) -> float | None:
        return self.inner.forecast_upper(t_s * self.scale, horizon_s * self.scale, quantile)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "scale": self.scale, "inner": self.inner.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimeScaledForecaster:
        return cls(forecaster_from_dict(d["inner"]), float(d["scale"]))


def restore_forecaster(d: dict[str, Any]) -> Forecaster:
    if isinstance(d, dict) and d.get("kind") == TimeScaledForecaster.kind:
        return TimeScaledForecaster.from_dict(d)
    return forecaster_from_dict(d)


def forecasting_key(spec: InferenceEndpointSpec, step_s: float) -> dict[str, Any]:
    """What the forecaster is built from: when any of it changes, a kept forecaster is wrong (its season,
    clock or model differ) and the operator rebuilds it from Prometheus history instead."""
    f = spec.scaling.forecasting
    return {"forecaster": f.forecaster or "auto", "season_s": float(f.seasonality_seconds or DAY_S),
            "time_compression": float(f.time_compression), "step_s": float(step_s),
            "signal": str(spec.scaling.signal)}


def forecaster_from_spec(spec: InferenceEndpointSpec, step_s: float) -> Forecaster:
    """The endpoint's forecaster, fed once per decision interval (`step_s`, wall seconds)."""
    f = spec.scaling.forecasting
    scale = float(f.time_compression)
    kwargs: dict[str, Any] = {"step_s": step_s * scale}
    if f.seasonality_seconds:
        kwargs["season_s"] = float(f.seasonality_seconds)
    inner = make_forecaster(f.forecaster or "auto", **kwargs)
    return inner if scale == 1.0 else TimeScaledForecaster(inner, scale)


def forecast_ready(autoscaler: Autoscaler) -> bool:
    """Whether the forecaster has the history it needs (status condition ForecastReady)."""
    return bool(getattr(autoscaler.forecaster, "ready", False))


def seed(autoscaler: Autoscaler, samples: list[tuple[float, float]]) -> int:
    """Replay history (time, signal) into the forecaster; returns how many samples went in."""
    for t, v in samples:
        autoscaler.forecaster.update(t, v)
    return len(samples)


def saved_state(autoscaler: Autoscaler, key: dict[str, Any]) -> dict[str, Any]:
    """What `.status.forecaster` holds: the autoscaler's state and the forecasting key it was built for."""
    return {"autoscaler": autoscaler.to_dict(), "forecasting": key}


def restore_autoscaler(data: dict[str, Any], config: PolicyConfig, spec: InferenceEndpointSpec) -> Autoscaler:
    """Restore `saved_state` under the current spec's config; raises if the format is unknown or the state
    was built for other forecasting settings (season, clock, model, signal, step)."""
    key = forecasting_key(spec, config.decision_interval_s)
    saved_key = data.get("forecasting")
    if saved_key is not None and saved_key != key:
        raise ValueError(f"saved forecaster was built for {saved_key}, the spec now asks for {key}")
    a = data["autoscaler"]
    return Autoscaler(config, restore_forecaster(a["forecaster"]), PolicyState.from_dict(a["state"]))
