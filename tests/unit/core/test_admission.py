"""The admission gate under threads: never more than its bound, back to zero, exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time

from server.core.admission import Admission, Ticket


def test_the_bound_holds_under_concurrent_acquires_and_random_releases() -> None:
    gate = Admission(slots=2, max_waiting=1)
    held: list[Ticket] = []
    lock = threading.Lock()
    peak = 0
    refused = 0
    start = threading.Barrier(16)

    def worker(seed: int) -> None:
        nonlocal peak, refused
        rng = random.Random(seed)
        start.wait()  # every thread starts together
        for _ in range(300):
            ticket = gate.try_acquire()
            with lock:
                if ticket is None:
                    refused += 1
                else:
                    held.append(ticket)
                peak = max(peak, gate.held)
                assert gate.held <= gate.bound
                victim = held.pop(rng.randrange(len(held))) if held and rng.random() < 0.6 else None
            if victim is not None:
                victim.release()
                victim.release()  # a second release changes nothing
            if rng.random() < 0.1:
                time.sleep(0)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for ticket in held:
        ticket.release()
    assert gate.held == 0
    assert peak == gate.bound  # the bound was reached, never passed
    assert refused == gate.refused > 0
    assert gate.highest_waiting == 1
    assert gate.waiting == 0


def test_refusals_are_reported() -> None:
    gate = Admission(slots=1, max_waiting=0)
    seen: list[int] = []
    gate.on_refused = lambda: seen.append(1)
    first = gate.try_acquire()
    assert first is not None
    assert gate.try_acquire() is None
    assert seen == [1]
    first.release()
    again = gate.try_acquire()
    assert again is not None
    assert gate.refused == 1


def test_a_response_running_a_tool_gives_its_place_to_the_next_request() -> None:
    async def run() -> None:
        gate = Admission(slots=1, max_waiting=0)
        tool_runner = gate.try_acquire()
        assert tool_runner is not None
        assert gate.try_acquire() is None  # full
        assert tool_runner.step_out()
        other = gate.try_acquire()  # admitted while the tool runs
        assert other is not None
        assert (gate.held, gate.out) == (1, 1)
        stepping_in = asyncio.create_task(tool_runner.step_in())
        await asyncio.sleep(0.01)
        assert not stepping_in.done()  # the gate is full: it waits
        assert gate.try_acquire() is None  # and a new request does not pass it
        other.release()  # the freed place is handed to the waiting response
        await asyncio.wait_for(stepping_in, 5)
        assert (gate.held, gate.out) == (1, 0)
        assert gate.try_acquire() is None
        tool_runner.release()
        assert (gate.held, gate.out) == (0, 0)

    asyncio.run(run())


def test_no_more_responses_step_out_than_the_gate_admits() -> None:
    gate = Admission(slots=1, max_waiting=1)
    tickets = [gate.try_acquire() for _ in range(4)]
    assert tickets[2] is None
    assert tickets[3] is None
    first, second = tickets[0], tickets[1]
    assert first is not None
    assert second is not None
    assert first.step_out()
    assert second.step_out()
    third, fourth = gate.try_acquire(), gate.try_acquire()
    assert third is not None
    assert fourth is not None
    assert not third.step_out()  # two are out already: this one keeps its place
    for ticket in (first, second, third, fourth):
        ticket.release()
    assert (gate.held, gate.out) == (0, 0)


def test_a_response_that_leaves_while_waiting_to_step_in_frees_everything() -> None:
    async def run() -> None:
        gate = Admission(slots=1, max_waiting=0)
        ticket = gate.try_acquire()
        assert ticket is not None
        assert ticket.step_out()
        other = gate.try_acquire()
        assert other is not None
        stepping_in = asyncio.create_task(ticket.step_in())
        await asyncio.sleep(0.01)
        stepping_in.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stepping_in
        ticket.release()
        other.release()  # nobody waits now: the place is free for a new request
        assert (gate.held, gate.out) == (0, 0)
        assert gate.try_acquire() is not None

    asyncio.run(run())
