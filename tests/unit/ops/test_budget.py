"""The memory budget's choice (server.ops.budget.room_for): what must be unloaded so that a
model can load, least recently used first, never a busy one, nothing when it would not help."""

from __future__ import annotations

from server.ops.budget import Resident, room_for

GB = 1_000_000_000


def resident(key: str, gb: int, last_used: float, busy: bool = False) -> Resident[str]:
    return Resident(key, gb * GB, busy, last_used)


def test_a_model_that_fits_beside_the_others_unloads_nothing() -> None:
    loaded = [resident("a", 4, 1.0), resident("b", 4, 2.0)]
    assert room_for(2 * GB, loaded, 10 * GB) == []


def test_the_least_recently_used_idle_model_goes_first() -> None:
    loaded = [resident("new", 4, 9.0), resident("old", 4, 1.0), resident("mid", 4, 5.0)]
    assert room_for(4 * GB, loaded, 12 * GB) == ["old"]
    assert room_for(8 * GB, loaded, 12 * GB) == ["old", "mid"]


def test_a_busy_model_is_never_unloaded() -> None:
    loaded = [resident("old", 4, 1.0, busy=True), resident("new", 4, 9.0)]
    assert room_for(4 * GB, loaded, 8 * GB) == ["new"]


def test_nothing_is_unloaded_when_it_would_not_make_room() -> None:
    loaded = [resident("busy", 6, 1.0, busy=True), resident("idle", 2, 2.0)]
    assert room_for(4 * GB, loaded, 8 * GB) is None


def test_a_model_larger_than_the_budget_loads_alone() -> None:
    assert room_for(20 * GB, [], 8 * GB) == []
    loaded = [resident("a", 1, 1.0), resident("b", 1, 2.0)]
    assert room_for(20 * GB, loaded, 8 * GB) == ["a", "b"]
    assert room_for(20 * GB, [resident("a", 1, 1.0, busy=True)], 8 * GB) is None


def test_the_count_limit_unloads_even_when_memory_is_left() -> None:
    loaded = [resident("a", 1, 3.0), resident("b", 1, 2.0)]
    assert room_for(1 * GB, loaded, 100 * GB, max_loaded=2) == ["b"]
    assert room_for(1 * GB, loaded, 100 * GB, max_loaded=3) == []
    assert room_for(1 * GB, [resident("a", 1, 1.0, busy=True)], 100 * GB, max_loaded=1) is None


def test_exactly_full_fits() -> None:
    assert room_for(4 * GB, [resident("a", 4, 1.0)], 8 * GB) == []
