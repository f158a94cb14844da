"""A warm replica's size and cost: the serving container's resources with scaling.warmPool.resources laid
over them, the checks that make an in-place resize between the two legal, and what a warm replica costs
relative to a serving one.

The cost model: a replica costs what its container requests (the scheduler reserves requests, so they
are what a node is bought for; a limit stands in where no request is set, as Kubernetes defaults a
missing request to the limit), priced as CPU cores + memory GiB x `memory_cost_per_gib`, the price of
one GiB in CPU cores. The default 0.134 is GCP's on-demand N2 price list (us-central1): $0.004237 per
GiB-hour / $0.031611 per vCPU-hour. AWS's general-purpose families land in the same place (m7i: ~0.13).
Pure functions over plain dicts, so spec validation, the builders and the plan share them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

# GCP N2 on-demand, us-central1: $0.004237 per GiB-hour / $0.031611 per vCPU-hour.
MEMORY_COST_PER_GIB = 0.134
RESIZABLE = ("cpu", "memory")  # what an in-place resize changes
KINDS = ("requests", "limits")
GIB = Decimal(1024**3)

Resources = dict[str, dict[str, str]]  # {"requests": {"cpu": "2"}, "limits": {...}}


def quantity(value: str | int | float) -> Decimal:
    """A Kubernetes quantity ("500m", "2Gi", 3) as a number; ValueError on anything else."""
    return parse_quantity(value)


def defaulted(r: Resources) -> Resources:
    """As the API server stores it: a missing request is the limit (so a comparison with a live pod holds)."""
    req, lim = dict(r.get("requests") or {}), dict(r.get("limits") or {})
    for name, value in lim.items():
        req.setdefault(name, value)
    return {kind: d for kind, d in (("requests", req), ("limits", lim)) if d}


def overlay(serving: Resources, warm: Resources) -> Resources:
    """The warm container's resources: the serving ones with the warm pool's laid over them, defaulted."""
    return defaulted({kind: {**(serving.get(kind) or {}), **(warm.get(kind) or {})} for kind in KINDS})


def same(a: Resources, b: Resources) -> bool:
    """Equal as quantities ("1" == "1000m") once defaulted, for cpu and memory."""
    def norm(r: Resources) -> dict[tuple[str, str], Decimal]:
        return {(k, n): quantity(v) for k, d in defaulted(r).items() for n, v in d.items() if n in RESIZABLE}
    return norm(a) == norm(b)


def qos_class(r: Resources) -> str:
    """The pod QoS class a single container with these resources gives (Kubernetes' rules)."""
    req, lim = r.get("requests") or {}, r.get("limits") or {}
    if not req and not lim:
        return "BestEffort"
    guaranteed = all(n in lim and quantity(req.get(n, lim[n])) == quantity(lim[n]) for n in RESIZABLE)
    return "Guaranteed" if guaranteed else "Burstable"


def problems(serving: Resources, warm: Resources) -> list[str]:
    """Why the warm pool's resources cannot be an in-place resize of the serving ones (empty: they can)."""
    out = []
    for kind in KINDS:
        for name, value in (warm.get(kind) or {}).items():
            where = f"scaling.warmPool.resources.{kind}.{name}"
            if name not in RESIZABLE:
                out.append(f"{where}: only cpu and memory are resized in place")
                continue
            base = (serving.get(kind) or {}).get(name)
            if base is None:
                out.append(f"{where} needs resources.{kind}.{name} (the serving size a promotion resizes back to)")
            elif quantity(value) > quantity(base):
                out.append(f"{where} ({value}) is above resources.{kind}.{name} ({base}): a warm replica must not "
                           "be larger than a serving one")
    if out:
        return out
    size = overlay(serving, warm)
    for name in RESIZABLE:
        req, lim = (size.get("requests") or {}).get(name), (size.get("limits") or {}).get(name)
        if req is not None and lim is not None and quantity(req) > quantity(lim):
            out.append(f"scaling.warmPool.resources: the warm requests.{name} ({req}) is above its limits.{name} "
                       f"({lim})")
    if not out and qos_class(size) != qos_class(serving):
        out.append(f"scaling.warmPool.resources would change the pod's QoS class ({qos_class(serving)} -> "
                   f"{qos_class(size)}), and Kubernetes resizes a pod in place only within its QoS class")
    return out


def memory_shrinks(serving: Resources, warm: Resources) -> bool:
    """Whether the warm pool asks for less memory than the serving pod has: the model stays loaded while
    warm, so its memory cannot be given back (a resize below what the process uses never completes)."""
    return any(quantity(value) < quantity(base)
               for kind in KINDS
               if (value := (warm.get(kind) or {}).get("memory")) is not None
               and (base := (serving.get(kind) or {}).get("memory")) is not None)


def cost(r: Resources, memory_cost_per_gib: float = MEMORY_COST_PER_GIB) -> float:
    """What a container of this size costs, in CPU cores (requests, a limit where no request is set)."""
    def amount(name: str) -> Decimal:
        value = (r.get("requests") or {}).get(name, (r.get("limits") or {}).get(name))
        return quantity(value) if value is not None else Decimal(0)
    return float(amount("cpu")) + float(amount("memory") / GIB) * memory_cost_per_gib


def cost_fraction(serving: Resources, warm: Resources, memory_cost_per_gib: float = MEMORY_COST_PER_GIB) -> float:
    """What a warm replica costs relative to a serving one, in (0, 1]; 1.0 where the serving size is
    unpriced (no cpu or memory set: nothing to compare)."""
    full = cost(serving, memory_cost_per_gib)
    if full <= 0:
        return 1.0
    return min(1.0, max(1e-6, cost(overlay(serving, warm), memory_cost_per_gib) / full))


def as_resources(spec_resources: Any) -> Resources:
    """A ResourcesSpec (or None) as plain string dicts, cpu and memory only."""
    if spec_resources is None:
        return {}
    return {kind: {n: str(v) for n, v in getattr(spec_resources, kind).items() if n in RESIZABLE}
            for kind in KINDS if getattr(spec_resources, kind)}


def _fmt(value: Any) -> Any:
    return value if isinstance(value, str | int) else str(value)


def container_resources(pod: dict[str, Any], container: str) -> Resources:
    """The cpu and memory one container of a pod (API dict) asks for now (its spec: the resize target)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            res = c.get("resources") or {}
            return {kind: {n: str(_fmt(v)) for n, v in (res.get(kind) or {}).items() if n in RESIZABLE}
                    for kind in KINDS if res.get(kind)}
    return {}
