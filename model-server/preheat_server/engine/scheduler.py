"""Which sequences run this step and with how many tokens (continuous batching, chunked prefill).

Each step has a token budget (``max_num_batched_tokens``). Running sequences go first, decodes before
prefill chunks, so inter-token latency does not wait behind long prompts; a prompt longer than what
is left of the budget is split into chunks over several steps. Waiting requests join while budget,
``max_num_seqs`` and the inter-token-latency cap allow. When a running sequence needs a KV block and
none is free, the most recently admitted running sequence is preempted: its blocks are freed and it
goes back to the front of the queue to be recomputed later (its full blocks usually come back from
the prefix cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledStep:
    batch: list[tuple[Sequence, int]] = field(default_factory=list)
    # Sequences that had to stop for good because the whole KV cache cannot hold them.
    out_of_kv: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.batch)


class ItlController:
    """Caps how many sequences run at once so a step stays within the target inter-token latency.

    Additive increase / multiplicative decrease on an EMA of step time: over the target, the cap
    shrinks to what the measured per-sequence cost allows; well under it, the cap grows by one.
    The cap only stops new admissions; running sequences are never preempted for latency.
    """

    def __init__(self, target_ms: float | None, max_num_seqs: int):
        self.target_s = None if target_ms is None else target_ms / 1000.0
        self.max_num_seqs = max_num_seqs
        self.cap = max_num_seqs
        self.ema_s: float | None = None

    def observe(self, step_seconds: float, batch_size: int) -> None:
        if self.target_s is None or batch_size == 0:
            return
        self.ema_s = step_seconds if self.ema_s is None else 0.7 * self.ema_s + 0.3 * step_seconds
        if self.ema_s > self.target_s:
            fit = int(batch_size * self.target_s / self.ema_s)
            self.cap = max(1, min(self.cap - 1, fit))
        elif self.ema_s < 0.8 * self.target_s and batch_size >= self.cap:
            self.cap = min(self.max_num_seqs, self.cap + 1)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 itl: ItlController):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.itl = itl
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and free its blocks (finish or abort)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free_sequence(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free_sequence(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.max_num_batched_tokens
        scheduled: set[str] = set()
        # Decodes (one token left to compute) first, then unfinished prefills, each in admission order.
        order = sorted(self.running, key=lambda s: (s.num_uncomputed_tokens > 1, s.arrival))
        for seq in order:
            if budget == 0:
                break
            if seq not in self.running:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.bm.can_append(seq, n):
                victims = [s for s in self.running if s.request_id not in scheduled]
                victim = max(victims, key=lambda s: s.arrival)
                if victim is seq and len(self.running) == 1:
                    # Alone and still no room: the KV cache cannot hold this sequence at all.
                    step.out_of_kv.append(seq)
                    break
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.bm.append(seq, n)
                step.batch.append((seq, n))
                scheduled.add(seq.request_id)
                budget -= n
        cap = min(self.max_num_seqs, self.itl.cap)
        while self.waiting and budget > 0 and len(self.running) < cap:
            seq = self.waiting[0]
            cached = self.bm.match_prefix(seq)
            n = min(seq.num_tokens - len(cached) * self.bm.block_size, budget)
            if not self.bm.can_admit(seq, cached, n):
                break
            self.waiting.popleft()
            self.bm.admit(seq, cached)
            if not seq.first_scheduled:
                seq.first_scheduled = True
                seq.num_cached_tokens = seq.num_computed_tokens
            self.bm.append(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            step.batch.append((seq, n))
            budget -= n
        return step
