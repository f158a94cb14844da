"""The policy's TimeWindow: a running maximum over the last span, kept as a monotone queue."""

import itertools
import random

import pytest
from preheat.scaling.policy.types import PolicyState
from preheat.scaling.policy.window import TimeWindow


def _brute_max(history: list[tuple[float, int]], now: float, span: float) -> int | None:
    values = [v for t, v in history if now - span < t <= now]
    return max(values) if values else None


@pytest.mark.parametrize("span", [30.0, 60.0, 300.0])
def test_max_equals_the_brute_force_maximum_and_the_queue_stays_monotone(span):
    rng = random.Random(int(span))
    window, history, now = TimeWindow(), [], 0.0
    for _ in range(500):
        now += rng.choice([1.0, 5.0, 15.0, 40.0])
        value = rng.randrange(0, 20)
        window = window.record(now, value, span)
        history.append((now, value))
        assert window.max(now, span) == _brute_max(history, now, span)
        values = [v for _, v in window]
        assert all(a > b for a, b in itertools.pairwise(values))  # only possible maxima kept


def test_entries_from_the_future_are_dropped_and_windows_are_immutable():
    window = TimeWindow([(100.0, 5)])
    after = window.record(50.0, 1, 300.0)  # the clock went backwards: the t=100 entry cannot count
    assert after == ((50.0, 1),) and window == ((100.0, 5),)
    assert after.max(50.0, 300.0) == 1
    assert TimeWindow().max(0.0, 10.0) is None


def test_within_and_shifted():
    window = TimeWindow([(10.0, 9), (50.0, 4), (90.0, 2)])
    assert window.within(100.0, 60.0) == ((50.0, 4), (90.0, 2))
    assert window.shifted(30.0, 100.0) == ((40.0, 9), (80.0, 4), (100.0, 2))  # none past now


def test_policy_state_holds_windows_and_round_trips_them():
    state = PolicyState(serving_recommendations=((45.0, 20),), burst_needs=[(1.0, 3)])
    assert isinstance(state.serving_recommendations, TimeWindow) and isinstance(state.burst_needs, TimeWindow)
    restored = PolicyState.from_dict(state.to_dict())
    assert restored == state and isinstance(restored.total_recommendations, TimeWindow)
