"""A time window's running maximum: record a value at a time, read the largest in the last span.

Shaped after Knative's `pkg/autoscaler/aggregation/max` TimeWindow. The policy keeps three of them
(the serving and total recommendations for scale-down stabilization, the burst envelope's
short-window needs); each is part of the policy's immutable state, so every operation returns a new
window. Entries are kept as a monotone queue: only those that can still be the window's maximum.
"""

from __future__ import annotations

from collections.abc import Iterable


class TimeWindow(tuple[tuple[float, int], ...]):
    """(time, value) entries, oldest first, each larger than every entry after it.

    A tuple, so a window compares equal to the same entries written as a plain tuple and is stored
    in the policy's state as its entries (`PolicyState.to_dict`). The span is given to each call,
    not kept: the stabilization window follows the lead time, which changes as cold starts are
    measured.
    """

    __slots__ = ()

    def __new__(cls, entries: Iterable[tuple[float, int]] = ()) -> TimeWindow:
        return super().__new__(cls, entries)

    def record(self, now: float, value: int, span_s: float) -> TimeWindow:
        """This window with (now, value) added and what can never be its maximum again dropped:
        entries older than the span, from the future (the clock went backwards), or older and not
        larger than the new value."""
        kept = [(t, v) for t, v in self if now - span_s < t <= now and v > value]
        kept.append((now, value))
        return TimeWindow(kept)

    def within(self, now: float, span_s: float) -> TimeWindow:
        """The entries of the last span_s seconds up to now."""
        return TimeWindow((t, v) for t, v in self if now - span_s < t <= now)

    def max(self, now: float, span_s: float) -> int | None:
        """The largest value recorded in the last span_s seconds up to now; None if there is none."""
        values = [v for t, v in self if now - span_s < t <= now]
        return max(values) if values else None

    def shifted(self, by_s: float, now: float) -> TimeWindow:
        """Every entry moved by_s seconds later, none past now (a data gap taken out of their age)."""
        return TimeWindow((min(t + by_s, now), v) for t, v in self)
