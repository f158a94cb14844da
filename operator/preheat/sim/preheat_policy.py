"""Preheat's own Autoscaler (the code the operator runs) set up for a simulated endpoint.

Only the PolicyConfig and the forecaster's sample spacing are chosen here; every decision comes from
`preheat.policy.Autoscaler.step`. `SIM_DEFAULTS` are the settings the README tables use; override any
PolicyConfig field with `preheat simulate --preheat key=value`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from preheat.forecast import make_forecaster
from preheat.policy import Autoscaler, Decision, Observation, PolicyConfig
from preheat.sim.baselines import PROMETHEUS, SimContext
from preheat.sim.traces import ColdStartModel

if TYPE_CHECKING:
    from preheat.sim.run import Workload

# Chosen for the README runs (see docs/simulator.md for why each differs from PolicyConfig's default).
SIM_DEFAULTS: dict[str, Any] = {
    "decision_interval_s": 15.0,
    "warm_pool_min": 0,
    "warm_pool_max": 3,
    "quantile": 0.8,
    "burst_memory_s": 120.0,
    # The fast panic path stays off: the operator has no loop between decisions yet (docs/simulator.md),
    # and the simulator evaluates only what the operator can run. `--preheat panic_interval_s=3` tries it.
    "panic_interval_s": None,
}


class PreheatPolicy:
    """Adapter: builds PolicyConfig from the workload and forwards `decide` to the Autoscaler."""

    name = "preheat"
    metrics = PROMETHEUS

    def __init__(self, workload: Workload, cold: ColdStartModel, overrides: dict[str, Any] | None = None) -> None:
        self.workload = workload
        self.cold = cold
        self.overrides = dict(overrides or {})
        self.forecaster_kind = self.overrides.pop("forecaster", "auto")

    def prepare(self, ctx: SimContext) -> None:
        self.ctx = ctx
        fields = {
            "min_replicas": 1,
            "max_replicas": ctx.max_replicas,
            "target_per_replica": ctx.target_per_replica,
            "target_utilization": ctx.target_utilization,
            "promotion_s": self.workload.fleet.promotion_s,
            "default_cold_start_s": self.cold.quantile(0.9),
            # per-request traces have concurrency slots and report running/waiting requests
            "concurrency_per_replica": float(self.workload.fleet.slots) if self._per_request() else None,
            **SIM_DEFAULTS,
            **self.overrides,
        }
        try:
            self.config = PolicyConfig(**fields)
        except TypeError as e:  # an unknown --preheat key
            raise ValueError(f"--preheat: {e}") from None
        self.interval_s = self.config.decision_interval_s
        # The fast panic path between decisions (per-request traces: it reads the queue gauges).
        self.panic_interval_s = self.config.panic_interval_s
        self.autoscaler = Autoscaler(self.config, make_forecaster(self.forecaster_kind, step_s=self.interval_s))

    def _per_request(self) -> bool:
        from preheat.sim.traces import RequestTrace

        return isinstance(self.workload.trace, RequestTrace)

    def initial(self) -> tuple[int, int]:
        need = max(self.config.floor_replicas, math.ceil(self.ctx.initial_rate / self.config.capacity_per_replica - 1e-9))
        return min(need, self.config.max_replicas), self.config.warm_pool_min

    def decide(self, obs: Observation) -> Decision:
        return self.autoscaler.step(obs)

    def panic_decide(self, obs: Observation) -> Decision | None:
        return self.autoscaler.panic_step(obs)
