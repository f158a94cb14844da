"""The scaling policy: how many serving replicas and how big a warm pool, and why.

Pure (no kopf, torch, kubernetes or I/O): `decide(config, state, observation, forecast_value,
forecast_upper) -> (Decision, PolicyState)`; `preheat.scaling.autoscaler.Autoscaler` wraps it
with a forecaster. One module per question: `signal` (what an observation's numbers are worth, the
lead time), `terms` (what the signals and the forecast ask to serve), `scale_down` (when capacity may
be given back), `warm` (the warm pool and the burst envelope), `zero` (scale to zero, the bounds),
`decide` (the decision that puts them together, and the hold on missing data).
"""

from preheat.scaling.policy.decide import decide, decide_panic
from preheat.scaling.policy.scale_down import hold_lead_times, stabilization_window_s
from preheat.scaling.policy.signal import (
    cold_start_s,
    is_valid_signal,
    lead_time_s,
    quantile,
    replicas_needed,
)
from preheat.scaling.policy.terms import noise_sigma
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
