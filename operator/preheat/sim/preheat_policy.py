"""Preheat's own Autoscaler (the code the operator runs) built for a simulated endpoint.

The autoscaler comes from an InferenceEndpoint spec through the operator's own function
(`preheat.scaling.from_spec.autoscaler_from_spec` over `policy_config`): the CRD's defaults, or the
spec of `preheat simulate --spec FILE.yaml`. There is no second defaults table. The simulator sets
only what the spec cannot know about a simulated fleet: the per-replica capacity (from the trace or
--capacity-rps), the target utilization every policy aims at, max_replicas, the promotion time, the
model server's slots on per-request traces, and what a warm replica costs (--warm-cost-fraction).
`--preheat key=value` overrides any PolicyConfig field on top (experiments, not defaults).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from preheat.scaling.from_spec import autoscaler_from_spec, policy_config
from preheat.scaling.policy import Decision, Observation, PolicyConfig
from preheat.sim.baselines import PROMETHEUS, MetricView, SimContext
from preheat.sim.traces import ColdStartModel

if TYPE_CHECKING:
    from preheat.controller.spec import InferenceEndpointSpec
    from preheat.sim.run import Workload


def default_spec() -> InferenceEndpointSpec:
    """The CRD's defaults (a model is required by the CRD; it does not change the scaling)."""
    from preheat.controller.spec import parse_spec

    return parse_spec({"model": {"builtin": "tiny"}})


def load_spec(path: str | Path) -> InferenceEndpointSpec:
    """An InferenceEndpoint manifest (or a bare `.spec` mapping) from YAML; ValueError says what is wrong."""
    import yaml

    from preheat.controller.spec import describe_error, parse_spec

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--spec: file not found: {path}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"--spec: cannot read {path}: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--spec: {path} must hold an InferenceEndpoint (a mapping), got {type(raw).__name__}")
    if raw.get("kind") not in (None, "InferenceEndpoint"):
        raise ValueError(f"--spec: {path} is a {raw.get('kind')!r}, not an InferenceEndpoint")
    body = raw.get("spec", raw) if "kind" in raw or "spec" in raw else raw
    try:
        return parse_spec(body)
    except Exception as e:  # pydantic's ValidationError: the same words a rejected CR gets
        raise ValueError(f"--spec {path}: {describe_error(e)}") from None


def metric_view(config: PolicyConfig) -> MetricView:
    """The signal as the operator's queries read it: `rate()` over the spec's windows (prometheus.window,
    prometheus.panicWindow) at the scrape interval the policy assumes, so `--spec` with another window
    simulates that window. A panic window shorter than two scrapes reads as two: the shortest rate()
    Prometheus can compute (the default 20 s panic window at a 15 s scrape is 30 s, as for HPA). The
    queries read the model servers' own counters, so at zero pods there is no signal (`needs_pods`),
    unless scale to zero is on: then the activator holds and counts the requests (controller/routing.py)
    and the operator reads its counter through the same scrape and windows."""
    return replace(PROMETHEUS, scrape_s=config.scrape_interval_s, window_s=config.stable_window_s,
                   panic_window_s=max(config.panic_window_s, 2.0 * config.scrape_interval_s), needs_pods=not config.scale_to_zero)


class PreheatPolicy:
    """Adapter: the spec's autoscaler with the simulated fleet's facts; forwards `decide` to it."""

    name = "preheat"
    metrics = PROMETHEUS
    # The policy reads the model servers' gauges (requests waiting and running), as scraped by `metrics`.
    reads_gauges = True

    def __init__(self, workload: Workload, cold: ColdStartModel, overrides: dict[str, Any] | None = None,
                 spec: InferenceEndpointSpec | None = None, warm_cost_fraction: float = 1.0) -> None:
        self.workload = workload
        self.cold = cold
        self.overrides = dict(overrides or {})
        self.spec = spec if spec is not None else default_spec()
        self.warm_cost_fraction = warm_cost_fraction
        kind = self.overrides.pop("forecaster", None)
        if kind is not None:
            forecasting = self.spec.scaling.forecasting.model_copy(update={"forecaster": str(kind)})
            scaling = self.spec.scaling.model_copy(update={"forecasting": forecasting})
            self.spec = self.spec.model_copy(update={"scaling": scaling})

    def host_fields(self, ctx: SimContext) -> dict[str, Any]:
        """What the simulated fleet, not the spec, decides."""
        return {
            "max_replicas": ctx.max_replicas,
            "target_per_replica": ctx.target_per_replica,
            "target_utilization": ctx.target_utilization,
            "warm_cost_fraction": self.warm_cost_fraction,
            # per-request traces have concurrency slots and report running/waiting requests
            "concurrency_per_replica": float(self.workload.fleet.slots) if self._per_request() else None,
        }

    def prepare(self, ctx: SimContext) -> None:
        self.ctx = ctx
        try:
            config = policy_config(self.spec).with_(**{**self.host_fields(ctx), **self.overrides})
        except TypeError as e:  # an unknown --preheat key
            raise ValueError(f"--preheat: {e}") from None
        self.config = config
        self.metrics = metric_view(config)
        self.interval_s = config.decision_interval_s
        # The fast panic path between decisions (per-request traces: it reads the queue gauges).
        self.panic_interval_s = config.panic_interval_s
        self.autoscaler = autoscaler_from_spec(self.spec, config)

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
