"""Pure status computation: conditions (with stable transition times) and the `.status` patch.

Conditions follow the Kubernetes convention {type, status, reason, message, lastTransitionTime,
observedGeneration}; lastTransitionTime only moves when `status` flips, so watchers can trust it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

READY = "Ready"
SCALING = "Scaling"
METRICS_AVAILABLE = "MetricsAvailable"
FORECAST_READY = "ForecastReady"
CONDITION_ORDER = (READY, SCALING, METRICS_AVAILABLE, FORECAST_READY)


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str = ""

    @property
    def status_str(self) -> str:
        return "Unknown" if self.status is None else ("True" if self.status else "False")


def merge_conditions(
    previous: list[dict[str, Any]] | None,
    updates: list[Condition],
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """Apply `updates` to `previous`, keeping lastTransitionTime where the status did not change."""
    by_type = {c.get("type"): dict(c) for c in previous or [] if c.get("type")}
    for cond in updates:
        old = by_type.get(cond.type)
        changed = old is None or old.get("status") != cond.status_str
        entry = {
            "type": cond.type,
            "status": cond.status_str,
            "reason": cond.reason,
            "message": cond.message[:1024],
            "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        by_type[cond.type] = entry
    ordered = [by_type.pop(t) for t in CONDITION_ORDER if t in by_type]
    return ordered + [by_type[k] for k in sorted(by_type)]


def condition_status(conditions: list[dict[str, Any]] | None, type_: str) -> str | None:
    for cond in conditions or []:
        if cond.get("type") == type_:
            return cond.get("status")
    return None


def ready_condition(
    serving_ready: int,
    floor: int,
    failing: int,
    failure: str,
    spec_error: str | None = None,
) -> Condition:
    """Ready when the serving floor is met with Ready pods; otherwise say what is missing and why."""
    if spec_error:
        return Condition(READY, False, "InvalidSpec", spec_error)
    if failing and serving_ready < max(floor, 1):
        return Condition(READY, False, "ModelServerFailing", failure or f"{failing} model-server pod(s) failing")
    if serving_ready >= floor and (serving_ready > 0 or floor == 0):
        msg = f"{serving_ready} serving replica(s) Ready"
        if failing:
            msg += f"; {failing} pod(s) failing: {failure}"
        return Condition(READY, True, "ServingReplicasReady", msg)
    return Condition(
        READY, False, "WaitingForReplicas", f"{serving_ready} of {max(floor, 1)} serving replica(s) Ready"
    )


def scaling_condition(current_total: int | None, desired_total: int, shortfall: int, preview: bool) -> Condition:
    if preview:
        return Condition(SCALING, False, "PreviewMode", "scaling.mode is Preview: decisions are reported, not applied")
    if shortfall > 0:
        return Condition(
            SCALING, True, "WaitingForWarmReplicas", f"{shortfall} serving replica(s) waiting for a pod to load"
        )
    if current_total is not None and current_total != desired_total:
        return Condition(SCALING, True, "Resizing", f"replicas {current_total} -> {desired_total}")
    return Condition(SCALING, False, "Stable", f"{desired_total} replica(s) as desired")


def build_status(
    *,
    generation: int | None,
    previous: dict[str, Any] | None,
    conditions: list[Condition],
    now: str,
    fields: dict[str, Any],
) -> dict[str, Any]:
    """The `.status` patch: the given fields plus merged conditions; None-valued fields are dropped."""
    previous = previous or {}
    out = {k: v for k, v in fields.items() if v is not None}
    out["conditions"] = merge_conditions(previous.get("conditions"), conditions, generation, now)
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def round_signal(value: float | None) -> float | None:
    """The signal in status is for people: three decimals is plenty and keeps status diffs quiet."""
    return None if value is None else round(float(value), 3)
