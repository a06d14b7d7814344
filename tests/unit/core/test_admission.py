"""The admission gate under threads: never more than its bound, back to zero, exactly once."""

from __future__ import annotations

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
