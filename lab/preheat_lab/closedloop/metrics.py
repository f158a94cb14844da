"""Pure figures of a closed-loop run: replica-seconds, capacity lead on the ramp, hidden cold starts.

Inputs are plain values recorded by the sampler (one `Sample` every few seconds, each holding the
endpoint's pods with their role and readiness) and the offered load of the replay schedule, so every
figure here is unit-tested without a cluster.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PodView:
    """One model-server pod as seen at a sample."""

    uid: str
    name: str
    role: str  # "serving" | "warm" | "" (no label yet)
    ready: bool
    created_s: float  # on the experiment's clock (seconds since the replay started; may be < 0)
    deleting: bool = False
    ready_since_s: float | None = None  # the Ready condition's lastTransitionTime, when Ready


@dataclass(frozen=True)
class Sample:
    """What the sampler saw at `t_s` (seconds since the replay started)."""

    t_s: float
    pods: tuple[PodView, ...] = ()
    status: dict = field(default_factory=dict)  # the InferenceEndpoint's .status

    @property
    def serving_ready(self) -> int:
        return sum(1 for p in self.pods if p.role == "serving" and p.ready and not p.deleting)

    @property
    def warm_ready(self) -> int:
        return sum(1 for p in self.pods if p.role != "serving" and p.ready and not p.deleting)

    @property
    def starting(self) -> int:
        return sum(1 for p in self.pods if not p.ready and not p.deleting)


def replica_seconds(samples: Sequence[Sample], t_start: float, t_end: float) -> dict[str, float]:
    """Replica-seconds paid for in [t_start, t_end], from pod lifetimes, split by what the pod was.

    A pod is paid for from its creation (it holds a node's resources while it loads) until the last
    sample that still saw it; each interval between samples is charged to the state the pod was in
    at its start (serving, warm or starting). Total = serving + warm + starting.
    """
    out = {"serving": 0.0, "warm": 0.0, "starting": 0.0}
    ordered = sorted(samples, key=lambda s: s.t_s)
    for a, b in itertools.pairwise(ordered):
        lo, hi = max(a.t_s, t_start), min(b.t_s, t_end)
        if hi <= lo:
            continue
        for p in a.pods:
            lo_p = max(lo, p.created_s)
            if hi <= lo_p:
                continue
            kind = "starting" if not p.ready else ("serving" if p.role == "serving" else "warm")
            out[kind] += hi - lo_p
    out["total"] = out["serving"] + out["warm"] + out["starting"]
    return out


def promotions(samples: Sequence[Sample], min_wait_s: float) -> list[dict]:
    """Warm → serving relabels seen between consecutive samples.

    A promotion *hid a cold start* when the pod had been Ready in the warm pool for more than
    `min_wait_s` (pass the decision interval plus the sampling period) before it was seen serving:
    it was loaded before the operator needed it, and the capacity came from a relabel. A pod that is
    promoted as soon as it becomes Ready (the pool was empty, or there is no pool — reactive mode,
    where every new pod passes through the warm label on its way in) exposed its cold start.
    """
    out: list[dict] = []
    prev_role: dict[str, str] = {}
    for s in sorted(samples, key=lambda s: s.t_s):
        for p in s.pods:
            before = prev_role.get(p.uid)
            if p.role == "serving" and before is not None and before != "serving":
                waited = (s.t_s - p.ready_since_s) if p.ready_since_s is not None else 0.0
                out.append({"t_s": s.t_s, "pod": p.name, "waited_warm_s": waited,
                            "hid_cold_start": waited > min_wait_s})
            prev_role[p.uid] = p.role
    return out


def reaction_times(decisions: Sequence[dict], samples: Sequence[Sample]) -> list[dict]:
    """For each decision that raised the serving count, how long until that many were serving and Ready.

    `decisions` carry `t_s`, `servingFrom`, `servingTo` (the operator's status.lastDecision). With a
    warm pool this is a relabel (seconds); without, it includes the cold start.
    """
    ordered = sorted(samples, key=lambda s: s.t_s)
    out = []
    for d in decisions:
        lo, hi = d.get("servingFrom"), d.get("servingTo")
        if lo is None or hi is None or hi <= lo:
            continue
        t = next((s.t_s for s in ordered if s.t_s >= d["t_s"] and s.serving_ready >= hi), None)
        if t is not None:
            out.append({"t_s": d["t_s"], "serving_from": lo, "serving_to": hi, "reaction_s": t - d["t_s"]})
    return out


def _cold_starts(samples: Sequence[Sample], key: str) -> dict[str, float]:
    first_ready: dict[str, float] = {}
    created: dict[str, float] = {}
    for s in sorted(samples, key=lambda s: s.t_s):
        for p in s.pods:
            k = getattr(p, key)
            created.setdefault(k, p.created_s)
            if p.ready:
                since = p.ready_since_s
                first_ready.setdefault(k, min(since, s.t_s) if since is not None else s.t_s)
    return {k: first_ready[k] - created[k] for k in first_ready if first_ready[k] - created[k] > 0}


def cold_start_seconds(samples: Sequence[Sample]) -> list[float]:
    """Creation → Ready, per pod that became Ready: the Ready condition's transition time when the
    sample carries it (pods that became Ready before sampling began count right), else the first
    sample that saw it Ready (an upper bound by one sample period)."""
    return list(_cold_starts(samples, "uid").values())


def cold_start_by_pod(samples: Sequence[Sample]) -> dict[str, float]:
    """`cold_start_seconds` keyed by pod name (unique within a run's namespace), to set beside what
    each pod's model server reports about its own cold start."""
    return _cold_starts(samples, "name")


def need_series(offered_t: np.ndarray, offered_rps: np.ndarray, target_per_replica: float,
                smooth_s: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """Serving replicas the offered load needs: ceil(rate over a trailing `smooth_s` / target)."""
    if target_per_replica <= 0:
        raise ValueError("target_per_replica must be > 0")
    if offered_t.size == 0:
        return offered_t, offered_t
    step = float(offered_t[1] - offered_t[0]) if offered_t.size > 1 else 1.0
    k = max(1, round(smooth_s / step))
    smooth = np.convolve(offered_rps, np.ones(k) / k, mode="full")[: offered_rps.size]
    # the first k bins average over fewer real bins
    counts = np.minimum(np.arange(1, offered_rps.size + 1), k)
    smooth = smooth * k / counts
    return offered_t, np.ceil(smooth / target_per_replica - 1e-9)


def capacity_lead(
    samples: Sequence[Sample], need_t: np.ndarray, need: np.ndarray, min_level: int = 2,
    loaded: bool = False,
) -> list[dict]:
    """For each replica count k the load comes to need (k ≥ min_level): when it first needed k
    serving replicas, when k were first in place, and the lead (positive = capacity was in place
    before the demand arrived; negative = demand waited).

    "In place" means serving and Ready; with `loaded=True` it means loaded and Ready, serving or in
    the warm pool (a warm replica becomes serving by a relabel, without a cold start).
    """
    ordered = sorted(samples, key=lambda s: s.t_s)
    out = []
    peak = int(need.max()) if need.size else 0
    for k in range(min_level, peak + 1):
        idx = np.flatnonzero(need >= k)
        if idx.size == 0:
            continue
        t_need = float(need_t[idx[0]])
        have = [s.t_s for s in ordered if (s.serving_ready + (s.warm_ready if loaded else 0)) >= k]
        # never reached within the run: the lead is at most this (a bound, flagged reached=False)
        t_have = have[0] if have else (ordered[-1].t_s if ordered else t_need)
        out.append({"replicas": k, "t_need_s": t_need, "t_have_s": t_have, "lead_s": t_need - t_have,
                    "reached": bool(have)})
    return out


def cold_start_waits(records: Sequence, samples: Sequence[Sample], need_t: np.ndarray, need: np.ndarray) -> dict:
    """Requests that waited on a cold start: scheduled while the offered load needed more serving
    replicas than were Ready (`need_series`) and a replica was starting (created, not Ready yet), i.e.
    the missing capacity was in a cold start. A warm pool that covers the need hides it (no request
    counts); a scale-up that starts pods only when the load is already there shows it. The state at a
    request's arrival is the last sample at or before it. Returns the count and how many of those
    requests missed the SLO."""
    ordered = sorted(samples, key=lambda s: s.t_s)
    times = np.array([s.t_s for s in ordered], dtype=float)
    n = missed = 0
    for r in records:
        i = int(np.searchsorted(times, r.scheduled_s, side="right")) - 1
        j = int(np.searchsorted(need_t, r.scheduled_s, side="right")) - 1
        if i < 0 or j < 0:
            continue
        s = ordered[i]
        if s.starting > 0 and s.serving_ready < need[j]:
            n += 1
            missed += 0 if r.slo_met else 1
    return {"requests": n, "missed_slo": missed}


def violations_per_bin(records: Sequence, bin_s: float, t_end: float) -> tuple[np.ndarray, np.ndarray]:
    """SLO misses per bin of scheduled time (for the plot)."""
    edges = np.arange(0.0, max(t_end, bin_s) + bin_s, bin_s)
    misses = [r.scheduled_s for r in records if not r.slo_met]
    counts, _ = np.histogram(misses, bins=edges)
    return edges[:-1], counts


_PROMOTED = re.compile(r"\((?P<reason>[A-Za-z]+): serving -> (?P<to>\d+)\)")
_SCALED = re.compile(r"\(serving (?P<to>\d+), warm pool \d+\): (?P<reason>[A-Za-z]+):")


def serving_orders(events: Sequence[dict], decisions: Sequence[dict] = ()) -> list[dict]:
    """Every time the operator asked for more serving replicas, with the term that won (its reason).

    From its Events (`Promoted` "… (forecast: serving -> 3)", `ScaledUp` "… (serving 3, warm pool 1):
    forecast: …"), which are durable, and from the `status.lastDecision` values the sampler saw.
    Sorted by time; each entry {t_s, serving_to, reason, source}."""
    out: list[dict] = []
    for e in events:
        msg, t = e.get("message") or "", e.get("t_s")
        if t is None:
            continue
        m = _PROMOTED.search(msg) if e.get("reason") == "Promoted" else (
            _SCALED.search(msg) if e.get("reason") == "ScaledUp" else None)
        if m:
            out.append({"t_s": float(t), "serving_to": int(m.group("to")), "reason": m.group("reason"),
                        "source": e["reason"]})
    for d in decisions:
        lo, hi = d.get("servingFrom"), d.get("servingTo")
        if lo is not None and hi is not None and hi > lo:
            out.append({"t_s": float(d["t_s"]), "serving_to": int(hi), "reason": str(d.get("reason")),
                        "source": "lastDecision"})
    return sorted(out, key=lambda o: o["t_s"])


def order_lead(levels: Sequence[dict], orders: Sequence[dict], cold_start_s: Sequence[float]) -> list[dict]:
    """Per replica level of `capacity_lead`: which decision first ordered that many serving replicas,
    why (its reason), how long before the demand needed them (`order_lead_s`), and whether that was at
    least the run's p90 measured cold start ahead (a replica started cold at that moment would have
    been Ready in time). `ready_lead_s` is the level's capacity lead (serving and Ready before need)."""
    cold = sorted(float(c) for c in cold_start_s)
    p90 = float(np.quantile(cold, 0.9)) if cold else None
    out = []
    for lv in levels:
        k = lv["replicas"]
        first = next((o for o in orders if o["serving_to"] >= k), None)
        lead = (lv["t_need_s"] - first["t_s"]) if first else None
        out.append({
            "replicas": k, "t_need_s": lv["t_need_s"], "ready_lead_s": lv["lead_s"], "ready": lv.get("reached", True),
            "ordered_at_s": first["t_s"] if first else None, "reason": first["reason"] if first else None,
            "order_lead_s": lead, "cold_start_p90_s": p90,
            "ordered_a_cold_start_ahead": bool(lead is not None and p90 is not None and lead >= p90),
        })
    return out


def forecast_summary(rows: Sequence[dict]) -> dict:
    """How many replica levels the forecast term ordered, and how many of those at least a cold start
    before the demand with serving capacity Ready before it."""
    fc = [r for r in rows if r.get("reason") == "forecast"]
    ahead = [r for r in fc if r["ordered_a_cold_start_ahead"] and r["ready"] and r["ready_lead_s"] >= 0]
    return {"levels": len(rows), "ordered_by_forecast": len(fc), "forecast_cold_start_ahead_and_ready": len(ahead),
            "max_forecast_order_lead_s": max((r["order_lead_s"] for r in fc), default=None)}
