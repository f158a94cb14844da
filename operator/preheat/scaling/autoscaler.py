"""The Autoscaler: one endpoint's forecaster and policy state, stepped once per decision.

This is the object the operator and the simulator both run: `step(observation)` feeds the
forecaster, asks it for the signal over the lead time, and calls the pure `decide`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from preheat.scaling.forecast import Forecaster, forecaster_from_dict, make_forecaster
from preheat.scaling.policy.decide import decide_measured, decide_panic
from preheat.scaling.policy.signal import is_valid_signal, measured_cold_starts
from preheat.scaling.policy.types import Decision, Observation, PolicyConfig, PolicyState


@runtime_checkable
class ScalingPolicy(Protocol):
    """Anything that turns an observation into a decision (Preheat's Autoscaler, the baselines)."""

    def decide(self, obs: Observation) -> Decision: ...


class Autoscaler:
    """Forecaster + PolicyConfig + PolicyState for one endpoint. Implements ScalingPolicy.

    The forecaster defaults to `make_forecaster("auto", step_s=decision_interval_s)`. Stale or
    missing observations are not fed to the forecaster (a gap, not a zero).
    """

    def __init__(
        self,
        config: PolicyConfig,
        forecaster: Forecaster | None = None,
        state: PolicyState | None = None,
    ) -> None:
        self.config = config
        self.forecaster = forecaster if forecaster is not None else make_forecaster(
            "auto", step_s=config.decision_interval_s
        )
        self.state = state if state is not None else PolicyState()

    def forecast_over(self, t_s: float, lead_s: float) -> tuple[float | None, float | None]:
        """(point, upper) forecast peaks over (now, now + window]; (None, None) without a basis.

        The window is the lead time, or `forecast_window_s` if longer. A peak shorter than the lead
        time must still be met by replicas ordered now, so the point forecast is taken at half and
        all of the lead time (and at the end of a longer window); the upper forecast, which sizes
        the warm pool, at the lead time (and the window's end).
        """
        if not self.config.forecasting:
            return None, None
        window = max(lead_s, self.config.forecast_window_s or 0.0)
        point_hs = [lead_s * 0.5, lead_s] + ([window] if window > lead_s else [])
        upper_hs = [lead_s] + ([window] if window > lead_s else [])
        points = [self.forecaster.forecast(t_s, h) for h in point_hs]
        uppers = [self.forecaster.forecast_upper(t_s, h, self.config.quantile) for h in upper_hs]
        points_ok = [p for p in points if p is not None and is_valid_signal(p)]
        uppers_ok = [u for u in uppers if u is not None and is_valid_signal(u)]
        return (max(points_ok) if points_ok else None, max(uppers_ok) if uppers_ok else None)

    def step(self, obs: Observation) -> Decision:
        """Observe, forecast, decide. Never raises on bad observations (they give a hold)."""
        fresh = not obs.stale and is_valid_signal(obs.value) and is_valid_signal(obs.time_s)
        if fresh:
            self.forecaster.update(float(obs.time_s), float(obs.value))  # type: ignore[arg-type]
        forecast_value = forecast_upper = None
        # Cleaned and sorted once per step: both the forecast horizon and the decision need them.
        measured, lead = measured_cold_starts(self.config, obs.cold_start_samples_s, self.state.cold_start_samples_s)
        if is_valid_signal(obs.time_s) or isinstance(obs.time_s, int | float):
            try:
                forecast_value, forecast_upper = self.forecast_over(float(obs.time_s), lead)
            except (TypeError, ValueError, OverflowError):
                forecast_value = forecast_upper = None
        # Until the forecaster has its full model the upper quantile sizes no warm margin and the short
        # trend floors the point forecast (decide_measured).
        ready = bool(getattr(self.forecaster, "ready", True))
        seasonal = ready and bool(getattr(self.forecaster, "seasonal", False))  # the hold: decide_measured
        decision, self.state = decide_measured(
            self.config, self.state, obs, forecast_value, forecast_upper, measured, lead, ready, seasonal
        )
        return decision

    def panic_step(self, obs: Observation) -> Decision | None:
        """The fast path between steps (every `panic_interval_s`): requests waiting promote Ready
        warm replicas, nothing else. None when there is nothing to do; the forecaster is not fed."""
        decision, self.state = decide_panic(self.config, self.state, obs)
        return decision

    # ScalingPolicy
    decide = step

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "state": self.state.to_dict(),
            "forecaster": self.forecaster.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], config: PolicyConfig | None = None) -> Autoscaler:
        """Restore; pass `config` to apply a changed spec while keeping the learned state."""
        return cls(
            config if config is not None else PolicyConfig.from_dict(d["config"]),
            forecaster_from_dict(d["forecaster"]),
            PolicyState.from_dict(d["state"]),
        )
