"""Slot choice: longest cached prefix first, shared prefixes, least recently used reuse, pinned
slots kept for their conversation."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from server.engine.base import SlotPin
from server.engine.slots import (
    Slot,
    SlotChoice,
    choose_slot,
    common_prefix_length,
    eviction_order,
    longest_prefix,
)


def test_prompt_goes_to_the_slot_with_its_prefix() -> None:
    slots = [Slot(0, [1, 2, 3], 1.0), Slot(1, [7, 8, 9, 10], 2.0), Slot(2, [], 0.0)]
    choice = choose_slot(slots, [7, 8, 9, 10, 11])
    assert choice is not None
    assert choice.slot.seq_id == 1
    assert choice.keep == 4
    assert choice.donor is None


def test_at_least_one_token_is_left_to_evaluate() -> None:
    choice = choose_slot([Slot(0, [1, 2, 3])], [1, 2, 3])
    assert choice is not None
    assert choice.keep == 2


def test_new_conversation_prefers_an_empty_slot_then_the_least_recent() -> None:
    slots = [Slot(0, [1, 2], 5.0), Slot(1, [], 9.0), Slot(2, [3, 4], 1.0)]
    first = choose_slot(slots, [9, 9, 9])
    assert first is not None
    assert first.slot.seq_id == 1
    slots[1].tokens = [5, 6]
    second = choose_slot(slots, [9, 9, 9])
    assert second is not None
    assert second.slot.seq_id == 2


def test_a_longer_prefix_elsewhere_is_shared() -> None:
    busy = Slot(0, [1, 2, 3, 4, 5, 6], 3.0, busy=True)
    idle = Slot(1, [1, 2, 9], 1.0)
    choice = choose_slot([busy, idle], [1, 2, 3, 4, 5, 7])
    assert choice is not None
    assert choice.slot is idle
    assert choice.keep == 2
    assert choice.donor is busy
    assert choice.shared == 5


def test_an_empty_slot_takes_a_prefix_from_a_busy_one() -> None:
    busy = Slot(0, [1, 2, 3, 4], 3.0, busy=True)
    empty = Slot(1, [], 1.0)
    assert choose_slot([busy, empty], [1, 2, 3, 9]) == SlotChoice(empty, 0, busy, 3)


def test_of_two_continuing_slots_the_longer_prefix_wins() -> None:
    short, long = Slot(0, [1, 2], 1.0), Slot(1, [1, 2, 3, 4], 2.0)
    assert choose_slot([short, long], [1, 2, 3, 4, 5]) == SlotChoice(long, 4)
    assert choose_slot([long, short], [1, 2, 3, 4, 5]) == SlotChoice(long, 4)


def test_the_same_prompt_again_continues_its_slot() -> None:
    """A regenerated answer: the slot holds the whole prompt, all but its last token kept."""
    recent, old = Slot(0, [1, 2, 3], 5.0), Slot(1, [7], 1.0)
    assert choose_slot([recent, old], [1, 2, 3]) == SlotChoice(recent, 2)


def test_a_prefix_no_longer_than_the_slots_own_is_not_shared() -> None:
    other = Slot(0, [1, 2, 7], 3.0, busy=True)
    mine = Slot(1, [1, 2, 8], 1.0)
    assert choose_slot([other, mine], [1, 2, 3, 4]) == SlotChoice(mine, 2)


def test_the_longest_prefix_any_slot_holds() -> None:
    slots = [Slot(0, [1, 2, 3]), Slot(1, [1, 2, 3, 4, 5], busy=True), Slot(2, [])]
    assert longest_prefix(slots, [1, 2, 3, 4, 9]) == 4
    assert longest_prefix(slots, [1, 2, 3, 4, 5]) == 5  # no token left to evaluate: all of it
    assert longest_prefix(slots, [8]) == 0
    assert longest_prefix([], [1, 2]) == 0


def test_no_idle_slot() -> None:
    assert choose_slot([Slot(0, [], busy=True)], [1, 2]) is None


def test_eviction_order_is_least_recently_used_idle_caches() -> None:
    slots = [Slot(0, [1], 3.0), Slot(1, [2], 1.0, busy=True), Slot(2, [3], 2.0), Slot(3, [], 0.0)]
    assert [s.seq_id for s in eviction_order(slots)] == [2, 0]


def test_a_pinned_slot_is_not_taken_though_least_recently_used() -> None:
    mine = SlotPin()
    pinned = Slot(0, [1, 2, 3], 1.0, pin=mine)
    other = Slot(1, [7, 8], 5.0)
    choice = choose_slot([pinned, other], [9, 9, 9])
    assert choice == SlotChoice(other, 0)
    mine.release()  # the socket closed: the slot is anyone's again, least recently used first
    assert choose_slot([pinned, other], [9, 9, 9]) == SlotChoice(pinned, 0)


def test_a_newcomer_waits_for_a_busy_unpinned_slot_rather_than_take_a_pinned_one() -> None:
    pinned = Slot(0, [1, 2, 3], 1.0, pin=SlotPin())
    running = Slot(1, [7, 8], 5.0, busy=True)
    assert choose_slot([pinned, running], [9, 9, 9]) is None
    running.busy = False
    assert choose_slot([pinned, running], [9, 9, 9]) == SlotChoice(running, 0)


def test_when_every_slot_is_pinned_the_least_recently_used_pin_yields() -> None:
    old = Slot(0, [1, 2, 3], 1.0, pin=SlotPin())
    recent = Slot(1, [4, 5, 6], 5.0, pin=SlotPin())
    assert choose_slot([old, recent], [9, 9, 9]) == SlotChoice(old, 0)
    assert choose_slot([recent, old], [9, 9, 9]) == SlotChoice(old, 0)
    old.busy = True  # pinned and running: the other pin yields
    assert choose_slot([old, recent], [9, 9, 9]) == SlotChoice(recent, 0)


def test_a_pin_whose_own_slot_is_busy_waits_for_it_rather_than_take_another_pin() -> None:
    mine = SlotPin()
    own = Slot(0, [1, 2, 3], 1.0, busy=True, pin=mine)  # its conversation still runs there
    others = Slot(1, [4, 5, 6], 0.5, pin=SlotPin())
    assert choose_slot([own, others], [1, 2, 3, 4], mine) is None
    own.busy = False
    assert choose_slot([own, others], [1, 2, 3, 4], mine) == SlotChoice(own, 3)


def test_a_pinned_conversation_continues_its_slot() -> None:
    mine = SlotPin()
    slots = [Slot(0, [1, 2, 3], 1.0, pin=mine), Slot(1, [], 0.0)]
    assert choose_slot(slots, [1, 2, 3, 4], mine) == SlotChoice(slots[0], 3)


def test_a_pinned_conversation_that_diverges_goes_back_to_its_own_slot() -> None:
    """After a final answer the analysis is dropped: the prompt diverges from the slot. Without
    a pin it takes an empty slot and shares the prefix; with one it stays in its own slot,
    keeping the same prefix, and leaves the other slot to other conversations."""
    mine = SlotPin()
    slots = [Slot(0, [1, 2, 3, 4], 1.0, pin=mine), Slot(1, [], 0.0)]
    assert choose_slot(slots, [1, 2, 9, 9], mine) == SlotChoice(slots[0], 2)
    assert choose_slot(slots, [1, 2, 9, 9]) == SlotChoice(slots[1], 0, slots[0], 2)


def test_another_prompt_shares_a_pinned_prefix_but_runs_elsewhere() -> None:
    pinned = Slot(0, [1, 2, 3, 4], 1.0, pin=SlotPin())
    other = Slot(1, [8], 5.0)
    # it continues the pinned conversation exactly (its stored response, over HTTP)
    assert choose_slot([pinned, other], [1, 2, 3, 4, 5]) == SlotChoice(other, 0, pinned, 4)


def test_a_pin_holding_no_slot_yet_takes_a_free_one() -> None:
    mine = SlotPin()
    taken = Slot(0, [1, 2], 1.0, pin=SlotPin())
    free = Slot(1, [3, 4], 2.0)
    assert choose_slot([taken, free], [5, 6, 7], mine) == SlotChoice(free, 0)


def test_pinned_slots_are_evicted_for_room_last() -> None:
    slots = [
        Slot(0, [1], 1.0, pin=SlotPin()),
        Slot(1, [2], 3.0),
        Slot(2, [3], 2.0, pin=SlotPin()),
        Slot(3, [4], 4.0),
    ]
    assert [s.seq_id for s in eviction_order(slots)] == [1, 3, 0, 2]
    assert slots[2].pin is not None
    slots[2].pin.release()
    assert [s.seq_id for s in eviction_order(slots)] == [2, 1, 3, 0]


def first_difference(a: list[int], b: list[int]) -> int:
    """The reference: token by token."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@given(
    length=st.integers(0, 20_000),
    cut=st.integers(0, 20_000),
    changed=st.one_of(st.none(), st.integers(0, 20_000)),
)
def test_the_common_prefix_is_where_the_first_token_differs(
    length: int, cut: int, changed: int | None
) -> None:
    """Long lists are compared a slice at a time: the first difference anywhere (at a slice's
    edge, inside one, past the shorter list's end) is found, as a token-by-token scan finds it."""
    rng = random.Random(length)
    a = [rng.randrange(201_088) for _ in range(length)]
    b = a[:cut] + [rng.randrange(201_088) for _ in range(rng.randrange(3))]
    if changed is not None and changed < len(b):
        b[changed] += 1
    expected = first_difference(a, b)
    assert common_prefix_length(a, b) == expected
    assert common_prefix_length(b, a) == expected
    assert common_prefix_length(tuple(a), b) == expected  # not two lists: token by token


def test_a_difference_at_each_slice_edge_is_found() -> None:
    a = list(range(10_000))
    for position in (0, 127, 128, 129, 4095, 4096, 4097, 8191, 8192, 9999):
        b = list(a)
        b[position] = -1
        assert common_prefix_length(a, b) == position
    assert common_prefix_length(a, a[:8192]) == 8192
    assert common_prefix_length(a, [*a, 5]) == 10_000
