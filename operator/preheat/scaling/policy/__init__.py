"""The scaling policy: how many serving replicas and how big a warm pool, and why.

Pure (no kopf, torch, kubernetes or I/O): `decide(config, state, observation, forecast_value,
forecast_upper) -> (Decision, PolicyState)`; `preheat.scaling.autoscaler.Autoscaler` wraps it
with a forecaster.
"""

from preheat.scaling.policy.decide import (
    cold_start_s,
    decide,
    decide_panic,
    hold_lead_times,
    is_valid_signal,
    lead_time_s,
    noise_sigma,
    quantile,
    replicas_needed,
    stabilization_window_s,
)
from preheat.scaling.policy.types import Decision, Observation, PolicyConfig, PolicyState, Reason

__all__ = [
    "Decision",
    "Observation",
    "PolicyConfig",
    "PolicyState",
    "Reason",
    "cold_start_s",
    "decide",
    "decide_panic",
    "hold_lead_times",
    "is_valid_signal",
    "lead_time_s",
    "noise_sigma",
    "quantile",
    "replicas_needed",
    "stabilization_window_s",
]
