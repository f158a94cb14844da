"""The Autoscaler: one endpoint's forecaster and policy state, stepped once per decision.

This is the object the operator and the simulator both run: `step(observation)` feeds the
forecaster, asks it for the signal over the lead time, and calls the pure `decide`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from preheat.forecast import Forecaster, forecaster_from_dict, make_forecaster
from preheat.policy.decide import clean_cold_starts, decide, is_valid_signal, lead_time_s
from preheat.policy.types import Decision, Observation, PolicyConfig, PolicyState


@runtime_checkable
class ScalingPolicy(Protocol):
    """Anything that turns an observation into a decision (Preheat's Autoscaler, the baselines)."""

    def decide(self, obs: Observation) -> Decision: ...


# The forecast that sizes serving is the peak over the lead time, sampled at these fractions of it:
# a peak shorter than the lead time still has to be met by replicas ordered now.
_LEAD_FRACTIONS = (0.5, 1.0)


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
        self.last_decision: Decision | None = None

    def lead_time_s(self, obs: Observation | None = None) -> float:
        samples = clean_cold_starts(obs.cold_start_samples_s) if obs is not None else ()
        return lead_time_s(self.config, samples or self.state.cold_start_samples_s)

    def forecast_over(self, t_s: float, lead_s: float) -> tuple[float | None, float | None]:
        """(point, upper) forecast peaks over (now, now + lead]; (None, None) without a basis."""
        if not self.config.forecasting:
            return None, None
        points: list[float] = []
        uppers: list[float] = []
        for frac in _LEAD_FRACTIONS:
            h = lead_s * frac
            p = self.forecaster.forecast(t_s, h)
            u = self.forecaster.forecast_upper(t_s, h, self.config.quantile)
            if p is not None and is_valid_signal(p):
                points.append(p)
            if u is not None and is_valid_signal(u):
                uppers.append(u)
        return (max(points) if points else None, max(uppers) if uppers else None)

    def step(self, obs: Observation) -> Decision:
        """Observe, forecast, decide. Never raises on bad observations (they give a hold)."""
        fresh = not obs.stale and is_valid_signal(obs.value) and is_valid_signal(obs.time_s)
        if fresh:
            self.forecaster.update(float(obs.time_s), float(obs.value))  # type: ignore[arg-type]
        forecast_value = forecast_upper = None
        if is_valid_signal(obs.time_s) or isinstance(obs.time_s, int | float):
            try:
                forecast_value, forecast_upper = self.forecast_over(float(obs.time_s), self.lead_time_s(obs))
            except (TypeError, ValueError, OverflowError):
                forecast_value = forecast_upper = None
        decision, self.state = decide(self.config, self.state, obs, forecast_value, forecast_upper)
        self.last_decision = decision
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
