"""Warm pool actuation, planned purely: which pods to promote or demote and what replicas to ask for.

The plan is computed from the pods as they are (labels, readiness, container states), never from
what the operator remembers, so a restart half-way through a scale-up recomputes the same plan and
never promotes twice. `scale.scale` does the I/O.

Counting rules (the usual reactive-autoscaler failure modes, avoided):
- only Ready pods are capacity; pods being deleted are nothing;
- pending / loading pods are `starting`, counted once (the Deployment's replicas already include
  them, so asking for `total` replicas never stacks 2 -> 4 -> 8);
- crash-looping pods are `failing`: not capacity, not starting, and they block nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from preheat.controller import warm_size
from preheat.controller.builders import (
    CONTAINER,
    COST_SERVING,
    COST_WARM,
    DELETION_COST,
    LABEL_ROLE,
    ROLE_SERVING,
    ROLE_WARM,
)

# Container states that mean "this pod will not become capacity without help".
FAILING_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one model-server pod."""

    name: str
    role: str
    ready: bool
    deleting: bool
    created_s: float
    ready_since_s: float | None
    failing: bool
    failure: str
    deletion_cost: str | None
    # The model server's cpu/memory as its spec asks now (a resize's target, whether or not applied yet).
    resources: warm_size.Resources = field(default_factory=dict, hash=False)

    @property
    def cold_start_s(self) -> float | None:
        """Creation -> Ready: the cold start this pod paid (None until Ready)."""
        if self.ready and self.ready_since_s is not None:
            return max(0.0, self.ready_since_s - self.created_s)
        return None


def pod_view(pod: dict[str, Any]) -> PodView:
    """Read a pod (a dict as the API returns it, camelCase) into a PodView."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    ready = False
    ready_since = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
            ready_since = _ts(cond.get("lastTransitionTime")) if ready else None
    failing, failure = False, ""
    if status.get("phase") == "Failed":
        failing, failure = True, status.get("message") or status.get("reason") or "pod failed"
    # An init container (model.uri's download) that fails keeps the pod Pending; its last words
    # (preheat-fetch's one line) say why, e.g. an HTTP 404 on the model's URI.
    statuses = [(cs, f"init container {cs.get('name')}: ") for cs in status.get("initContainerStatuses") or []]
    statuses += [(cs, "") for cs in status.get("containerStatuses") or []]
    for cs, where in statuses:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        terminated = state.get("terminated") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        # A container that crashed before and is not Ready now is failing too, even while the
        # runtime restarts it (otherwise the pod flaps between "failing" and "starting").
        crashed_before = bool(last) and last.get("exitCode", 0) != 0 and not cs.get("ready")
        if (waiting.get("reason") in FAILING_WAITING_REASONS or (terminated and terminated.get("exitCode", 0) != 0)
                or crashed_before):
            failing = True
            # The server's own last words (termination message) say why far better than the reason.
            detail = (
                (terminated.get("message") or last.get("message") or waiting.get("message") or "").strip()
            )
            reason = waiting.get("reason") or terminated.get("reason") or "Error"
            code = terminated.get("exitCode", last.get("exitCode"))
            failure = f"{reason} (exit code {code}): {detail}" if detail else f"{reason} (exit code {code})"
            failure = where + failure
            break
    return PodView(
        name=meta.get("name", ""),
        role=labels.get(LABEL_ROLE, ROLE_WARM),
        ready=ready and not failing,
        deleting=meta.get("deletionTimestamp") is not None,
        created_s=_ts(meta.get("creationTimestamp")) or 0.0,
        ready_since_s=ready_since,
        failing=failing,
        failure=failure,
        deletion_cost=annotations.get(DELETION_COST),
        resources=warm_size.container_resources(pod, CONTAINER),
    )


@dataclass(frozen=True)
class PodCounts:
    serving_ready: int
    warm_ready: int
    starting: int
    failing: int
    serving_labelled: int

    @property
    def ready(self) -> int:
        return self.serving_ready + self.warm_ready


def count(pods: list[PodView]) -> PodCounts:
    live = [p for p in pods if not p.deleting]
    return PodCounts(
        serving_ready=sum(p.ready and p.role == ROLE_SERVING for p in live),
        warm_ready=sum(p.ready and p.role == ROLE_WARM for p in live),
        starting=sum(not p.ready and not p.failing for p in live),
        failing=sum(p.failing for p in live),
        serving_labelled=sum(p.role == ROLE_SERVING for p in live),
    )


@dataclass(frozen=True)
class PodPatch:
    """A metadata patch for one pod: its role label and deletion cost."""

    name: str
    role: str
    cost: str

    def body(self) -> dict[str, Any]:
        return {"metadata": {"labels": {LABEL_ROLE: self.role}, "annotations": {DELETION_COST: self.cost}}}


@dataclass(frozen=True)
class PodResize:
    """An in-place resize of one pod's model server (the pod `resize` subresource)."""

    name: str
    resources: warm_size.Resources
    up: bool  # to the serving size (before the pod joins the Service) or down to the warm one (after it left)

    def body(self) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": CONTAINER, "resources": self.resources}]}}


@dataclass(frozen=True)
class Plan:
    """What to change, in the order to change it: promotions, demotions, cost fixes, then replicas."""

    promote: tuple[str, ...] = ()
    demote: tuple[str, ...] = ()
    fix_cost: tuple[PodPatch, ...] = ()
    replicas: int | None = None  # None: leave the Deployment's replicas alone
    shortfall: int = 0  # serving replicas wanted but not yet available (no Ready warm pod to promote)
    resize: tuple[PodResize, ...] = ()  # warmPool.resources: Ready pods not at their role's size

    @property
    def resize_up(self) -> tuple[PodResize, ...]:
        """Before the relabels: a promoted pod serves at full size from its first request."""
        return tuple(r for r in self.resize if r.up)

    @property
    def resize_down(self) -> tuple[PodResize, ...]:
        """After the relabels: a demoted pod shrinks only once it is out of the Service."""
        return tuple(r for r in self.resize if not r.up)

    @property
    def empty(self) -> bool:
        return not (self.promote or self.demote or self.fix_cost or self.resize or self.replicas is not None)

    def patches(self) -> list[PodPatch]:
        out = [PodPatch(n, ROLE_SERVING, COST_SERVING) for n in self.promote]
        out += [PodPatch(n, ROLE_WARM, COST_WARM) for n in self.demote]
        return out + list(self.fix_cost)


def plan(pods: list[PodView], serving: int, total: int, current_replicas: int | None,
         sizes: tuple[warm_size.Resources, warm_size.Resources] | None = None) -> Plan:
    """Move the pods toward `serving` Ready serving pods and `total` Deployment replicas.

    Promotes the warm pods that have been Ready longest (most surely loaded) and demotes the
    youngest serving pods (the ones most recently added). Serving-labelled pods that are not Ready
    keep their label (they rejoin when Ready) but do not count, so a crash-looping pod never
    holds capacity hostage. With `sizes` (serving, warm: `builders.pod_sizes`) every Ready pod is
    resized in place to its role's size once it has it.
    """
    serving = max(0, serving)
    total = max(serving, total)
    live = [p for p in pods if not p.deleting]
    serving_ready = [p for p in live if p.ready and p.role == ROLE_SERVING]
    warm_ready = [p for p in live if p.ready and p.role == ROLE_WARM]
    promote: list[str] = []
    demote: list[str] = []
    shortfall = 0
    if len(serving_ready) < serving:
        need = serving - len(serving_ready)
        candidates = sorted(warm_ready, key=lambda p: (p.ready_since_s or 0.0, p.name))
        promote = [p.name for p in candidates[:need]]
        shortfall = need - len(promote)
    elif len(serving_ready) > serving:
        candidates = sorted(serving_ready, key=lambda p: (-(p.ready_since_s or 0.0), p.name))
        demote = [p.name for p in candidates[: len(serving_ready) - serving]]
    touched = set(promote) | set(demote)
    fix = tuple(
        PodPatch(p.name, p.role, COST_SERVING if p.role == ROLE_SERVING else COST_WARM)
        for p in live
        if p.name not in touched
        and p.deletion_cost != (COST_SERVING if p.role == ROLE_SERVING else COST_WARM)
    )
    replicas = total if current_replicas != total else None
    resize = _resizes(live, set(promote), set(demote), sizes) if sizes else ()
    return Plan(tuple(promote), tuple(demote), fix, replicas, shortfall, resize)


def _resizes(live: list[PodView], promote: set[str], demote: set[str],
             sizes: tuple[warm_size.Resources, warm_size.Resources]) -> tuple[PodResize, ...]:
    """Ready pods whose size is not their role's (after this plan's relabels). A pod still loading keeps
    the serving size it was born with: its model loads at full speed."""
    out = []
    for p in live:
        if not p.ready:
            continue
        serves = p.name in promote or (p.role == ROLE_SERVING and p.name not in demote)
        want = sizes[0] if serves else sizes[1]
        if not warm_size.same(p.resources, want):
            out.append(PodResize(p.name, want, up=serves))
    return tuple(out)


def cold_start_samples(pods: list[PodView]) -> dict[str, float]:
    """Creation -> Ready seconds of each Ready pod, by name (the operator keeps a rolling window)."""
    return {p.name: s for p in pods if (s := p.cold_start_s) is not None}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); None for no data."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[k]


def first_failure(pods: list[PodView]) -> PodView | None:
    failing = [p for p in pods if p.failing and not p.deleting]
    return min(failing, key=lambda p: p.name) if failing else None


def with_role(view: PodView, role: str) -> PodView:
    return dataclasses.replace(view, role=role)
