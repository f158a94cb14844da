"""The fleet model every policy is judged on: replicas that start cold, wait warm, serve, and drain.

A replica is in one state at a time:

* `starting`: created, loading the model (a cold start); paid for, serves nothing. It knows whether
  it will join the serving set or the warm pool when it is Ready.
* `warm`: loaded and Ready but not receiving traffic (Preheat's warm pool); paid for.
* `promoting`: warm → serving relabel in flight (seconds: label change + endpoint propagation).
* `serving`: receives requests.
* `draining`: removed from service, finishing in-flight requests; paid for until it is empty.

The pool turns a policy's desired (serving, warm) counts into these transitions the way Preheat's
operator and a ReplicaSet would: promote warm replicas first, then re-purpose replicas already
starting, and only then start cold ones; on the way down cancel replicas still starting before
touching ready ones, and demote surplus serving replicas into the warm pool when it wants them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from preheat.sim.traces import ColdStartSampler

STARTING, WARM, PROMOTING, SERVING, DRAINING = "starting", "warm", "promoting", "serving", "draining"
DAY_S = 86400.0  # the unit of `ReplicaPool.cost_by_day`: days from the trace's start
STATES = (STARTING, WARM, PROMOTING, SERVING, DRAINING)


@dataclass(frozen=True)
class FleetConfig:
    """Physical constants of one serving replica (documented in docs/simulator.md).

    `capacity_rps` is what one replica serves flat out; policies are given `capacity_rps` as their
    per-replica target and aim at `target_utilization` of it. In the per-request model a replica has
    `slots` concurrency slots (vLLM's max_num_seqs) and a request holds a slot for
    prefill + output_tokens x decode time; latency is time to first token (queueing + prefill).
    """

    capacity_rps: float
    slots: int = 8
    prefill_tokens_per_s: float = 40_000.0
    decode_s_per_token: float = 0.025
    service_s: float = 1.0  # slot time of a request when the trace has no token counts
    first_token_s: float = 0.2  # time to first token without queueing when there are no token counts
    promotion_s: float = 2.0
    slo_s: float = 5.0


@dataclass(eq=False)
class Replica:
    id: int
    state: str
    dest: str  # where a starting replica goes when Ready: SERVING or WARM
    started_s: float
    ready_s: float
    busy: int = 0


class ReplicaPool:
    """Replica lifecycle shared by the per-request and the fluid engines; also does the billing."""

    def __init__(self, cold_starts: ColdStartSampler, promotion_s: float, now: float = 0.0) -> None:
        self._cold = cold_starts
        self.promotion_s = promotion_s
        self.replicas: dict[int, Replica] = {}
        self.count = dict.fromkeys(STATES, 0)
        self.starting_to_serving = 0
        self.replica_seconds = dict.fromkeys(STATES, 0.0)
        self.cold_starts = 0
        self.promotions = 0
        self.demotions = 0
        self.cancelled_starts = 0
        # The operator reports the most recent start-to-ready durations; 20 is plenty for a p90.
        self.observed_cold_starts: deque[float] = deque(maxlen=20)
        self._next_id = 0
        self._last_t = now
        self.next_transition_s = math.inf
        # Billing runs from billing_from_s (a warm-up left unscored) and stops at horizon_s (the end of the
        # trace), so every policy pays for the same window.
        self.billing_from_s = 0.0
        self.horizon_s = math.inf
        # The cumulative (all states, warm) replica-seconds at each midnight since the start, for
        # `cost_by_day`: a snapshot per day crossed keeps billing as cheap as before.
        self._midnights: list[tuple[float, float]] = []
        self._next_midnight = DAY_S

    # -- bookkeeping -------------------------------------------------------------------------------
    def bill(self, now: float) -> None:
        """Charge every replica for the time since the last change (piecewise-constant counts)."""
        now = min(now, self.horizon_s)
        start = max(self._last_t, self.billing_from_s)
        while self._next_midnight < now:  # rare: the billed span crosses midnight
            if start < self._next_midnight:
                self._charge(self._next_midnight - start)
                start = self._next_midnight
            self._midnights.append((self.total_seconds(), self.replica_seconds[WARM]))
            self._next_midnight += DAY_S
        self._charge(now - start)
        self._last_t = max(self._last_t, now)

    def _charge(self, dt: float) -> None:
        if dt > 0:
            for s in STATES:
                if self.count[s]:
                    self.replica_seconds[s] += self.count[s] * dt

    def cost_by_day(self, warm_cost_fraction: float = 1.0) -> dict[int, float]:
        """Replica-seconds paid for on each day from the start (they add up to `cost_seconds`)."""
        marks = [(0.0, 0.0), *self._midnights, (self.total_seconds(), self.replica_seconds[WARM])]
        return {d: (t1 - t0) - (1.0 - warm_cost_fraction) * (w1 - w0)
                for d, ((t0, w0), (t1, w1)) in enumerate(pairwise(marks))}

    def _set(self, r: Replica, state: str) -> None:
        if r.state == STARTING and r.dest == SERVING:
            self.starting_to_serving -= 1
        self.count[r.state] -= 1
        r.state = state
        self.count[state] += 1
        if state == STARTING and r.dest == SERVING:
            self.starting_to_serving += 1

    def _new(self, now: float, state: str, dest: str, cold_s: float) -> Replica:
        r = Replica(self._next_id, state, dest, now - (cold_s if state != STARTING else 0.0),
                    now + cold_s if state == STARTING else now)
        self._next_id += 1
        self.replicas[r.id] = r
        self.count[state] += 1
        if state == STARTING and dest == SERVING:
            self.starting_to_serving += 1
        return r

    def _remove(self, r: Replica) -> None:
        if r.busy > 0:
            self._set(r, DRAINING)
            return
        if r.state == STARTING and r.dest == SERVING:
            self.starting_to_serving -= 1
        self.count[r.state] -= 1
        del self.replicas[r.id]

    def released(self, r: Replica, now: float) -> None:
        """A request finished on `r` at `now`: a draining replica with nothing left goes away (billed up to
        `now` first, since the counts change; the per-request engine bills only before they can)."""
        if r.state == DRAINING and r.busy == 0:
            self.bill(now)
            self.count[DRAINING] -= 1
            del self.replicas[r.id]

    def total_seconds(self) -> float:
        return sum(self.replica_seconds.values())

    @property
    def serving_ready(self) -> int:
        return self.count[SERVING]

    @property
    def warm_ready(self) -> int:
        return self.count[WARM]

    @property
    def starting(self) -> int:
        return self.count[STARTING]

    @property
    def observed_serving(self) -> int:
        """Ready replicas labelled serving (promotions in flight included): what the operator reports
        as `current_serving` (its new pods start warm and are promoted when Ready)."""
        return self.count[SERVING] + self.count[PROMOTING]

    def cost_seconds(self, warm_cost_fraction: float = 1.0) -> float:
        """Replica-seconds paid for, a warm replica counted at `warm_cost_fraction` of a serving one
        (starting replicas load the model at full size, so they count in full)."""
        return self.total_seconds() - (1.0 - warm_cost_fraction) * self.replica_seconds[WARM]

    @property
    def current_serving(self) -> int:
        """Replicas that will serve, ready or not: what `apply` moves toward the desired count."""
        return self.count[SERVING] + self.count[PROMOTING] + self.starting_to_serving

    # -- transitions ---------------------------------------------------------------------------------
    def seed(self, now: float, serving: int, warm: int) -> None:
        """The fleet at the start of the trace: Ready replicas whose (sampled) cold starts are history."""
        for dest, n in ((SERVING, serving), (WARM, warm)):
            for _ in range(max(0, n)):
                cold = self._cold.draw()
                self.observed_cold_starts.append(cold)
                self._new(now, dest, dest, cold)

    def _start(self, now: float, dest: str) -> None:
        cold = self._cold.draw()
        r = self._new(now, STARTING, dest, cold)
        self.cold_starts += 1
        self.next_transition_s = min(self.next_transition_s, r.ready_s)

    def _by_state(self, state: str, dest: str | None = None) -> list[Replica]:
        return [r for r in self.replicas.values() if r.state == state and (dest is None or r.dest == dest)]

    def apply(self, now: float, serving: int, warm: int) -> None:
        """Move the fleet toward `serving` serving and `warm` warm replicas."""
        self.bill(now)
        serving, warm = max(0, int(serving)), max(0, int(warm))
        have = self.current_serving
        if serving > have:
            need = serving - have
            for r in sorted(self._by_state(WARM), key=lambda r: r.busy)[:need]:
                self._set(r, PROMOTING)
                r.ready_s = now + self.promotion_s
                self.next_transition_s = min(self.next_transition_s, r.ready_s)
                self.promotions += 1
                need -= 1
            for r in sorted(self._by_state(STARTING, WARM), key=lambda r: r.ready_s)[:need]:
                self.count[STARTING] -= 1  # re-destine: keep state, update the serving tally
                r.dest = SERVING
                self.count[STARTING] += 1
                self.starting_to_serving += 1
                need -= 1
            for _ in range(need):
                self._start(now, SERVING)
        elif serving < have:
            excess = have - serving
            warm_wanted = warm - (self.count[WARM] + self._count_starting(WARM))
            # Replicas still loading are the cheapest to give up: re-purpose for the warm pool or cancel.
            for r in sorted(self._by_state(STARTING, SERVING), key=lambda r: -r.ready_s)[:excess]:
                self.starting_to_serving -= 1
                if warm_wanted > 0:
                    r.dest = WARM
                    warm_wanted -= 1
                else:
                    self.count[STARTING] -= 1
                    del self.replicas[r.id]
                    self.cancelled_starts += 1
                excess -= 1
            ready = self._by_state(PROMOTING) + sorted(self._by_state(SERVING), key=lambda r: r.busy)
            for r in ready[:excess]:
                if warm_wanted > 0:
                    self._set(r, WARM)
                    self.demotions += 1
                    warm_wanted -= 1
                else:
                    self._remove(r)
        have_warm = self.count[WARM] + self._count_starting(WARM)
        if warm > have_warm:
            for _ in range(warm - have_warm):
                self._start(now, WARM)
        elif warm < have_warm:
            excess = have_warm - warm
            for r in sorted(self._by_state(STARTING, WARM), key=lambda r: -r.ready_s)[:excess]:
                self.count[STARTING] -= 1
                del self.replicas[r.id]
                self.cancelled_starts += 1
                excess -= 1
            for r in sorted(self._by_state(WARM), key=lambda r: r.busy)[:excess]:
                self._remove(r)

    def _count_starting(self, dest: str) -> int:
        return self.starting_to_serving if dest == SERVING else self.count[STARTING] - self.starting_to_serving

    def advance(self, now: float) -> list[Replica]:
        """Apply transitions due by `now`; return replicas that just became serving."""
        if now < self.next_transition_s:
            return []
        self.bill(now)
        became: list[Replica] = []
        nxt = math.inf
        for r in list(self.replicas.values()):
            if r.state == STARTING:
                if r.ready_s <= now:
                    self.observed_cold_starts.append(r.ready_s - r.started_s)
                    self._set(r, r.dest)
                    if r.state == SERVING:
                        became.append(r)
                else:
                    nxt = min(nxt, r.ready_s)
            elif r.state == PROMOTING:
                if r.ready_s <= now:
                    self._set(r, SERVING)
                    became.append(r)
                else:
                    nxt = min(nxt, r.ready_s)
        self.next_transition_s = nxt
        return became
