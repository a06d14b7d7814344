"""Admission: the one gate every request passes before its HTTP response starts.

A request reserves its place (running or waiting) in one atomic step when it is accepted; the
reservation is released exactly once, when its generation ends, is cancelled, when the client
leaves before the stream starts, or when preparing it fails. So a burst of simultaneous
requests can never admit more than `slots + max_waiting` of them: the rest are refused at once
(429 with Retry-After), before any of them reaches the engine.

While a server-run tool runs (an MCP call, python, the browser) its response needs no engine:
it steps out (`Ticket.step_out`), giving its place to the next request, and steps back in
before its next round (`Ticket.step_in`). Responses stepping back in are served first come,
first served, ahead of new requests (a freed place is handed to the longest waiting one; new
requests are refused while any waits). At most `slots + max_waiting` responses are out at once
(one more keeps its place while its tool runs), so responses alive, and the tools they run,
stay bounded.

Reasoning summaries are generations inside an admitted request and hold no reservation of their
own: they are bounded by the request that asked for them (one per reasoning segment).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Place = Literal["in", "out", "released"]


@dataclass(eq=False)
class Ticket:
    """One admitted request's place; `release()` may be called any number of times."""

    _gate: Admission
    _place: Place = "in"
    _waiter: asyncio.Future[None] | None = field(default=None, repr=False)

    def release(self) -> None:
        self._gate._release(self)

    @property
    def released(self) -> bool:
        return self._place == "released"

    def step_out(self) -> bool:
        """Give the engine place back while a server-run tool runs; False (the place kept)
        when as many responses are out as the gate admits, or the ticket is not in."""
        return self._gate._step_out(self)

    async def step_in(self) -> None:
        """Take a place again after `step_out`, waiting (ahead of new requests) while the gate
        is full. Cancelled while waiting, the ticket stays out; `release()` ends it."""
        await self._gate._step_in(self)


class Admission:
    """Counts reservations against `slots + max_waiting`; safe to use from any thread."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.bound = slots + max_waiting
        self._lock = threading.Lock()
        self._held = 0
        self._out = 0  # responses stepped out while their tools run
        self._waiters: deque[tuple[Ticket, asyncio.AbstractEventLoop]] = deque()
        self.highest_waiting = 0  # the deepest the queue has been since start
        self.refused = 0  # requests turned away because the bound was reached
        self.on_refused: Callable[[], object] | None = None  # e.g. a metrics counter

    def try_acquire(self) -> Ticket | None:
        """A reservation, or None (counted as refused) when the bound is reached."""
        with self._lock:
            full = self._held >= self.bound or bool(self._waiters)
            if full:
                self.refused += 1
            else:
                self._held += 1
                self.highest_waiting = max(self.highest_waiting, self._waiting())
        if full:
            if self.on_refused is not None:
                self.on_refused()
            return None
        return Ticket(self)

    @property
    def held(self) -> int:
        """Requests admitted, not finished and not stepped out: running or waiting for a
        sequence."""
        return self._held

    @property
    def out(self) -> int:
        """Responses stepped out while their server-run tools run."""
        return self._out

    @property
    def waiting(self) -> int:
        """Admitted requests beyond the sequences: the queue's depth."""
        with self._lock:
            return self._waiting()

    def _waiting(self) -> int:
        return max(0, self._held - self.slots)

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            place, ticket._place = ticket._place, "released"
            if place == "out":
                self._out -= 1
                self._waiters = deque(w for w in self._waiters if w[0] is not ticket)
            elif place == "in":
                self._free()

    def _step_out(self, ticket: Ticket) -> bool:
        with self._lock:
            if ticket._place != "in" or self._out >= self.bound:
                return False
            ticket._place = "out"
            self._out += 1
            self._free()
            return True

    async def _step_in(self, ticket: Ticket) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if ticket._place != "out":
                return
            if self._held < self.bound and not self._waiters:
                self._enter(ticket)
                return
            waiter = ticket._waiter = loop.create_future()
            self._waiters.append((ticket, loop))
        try:
            await waiter  # woken once `_free` handed it a place
        except BaseException:  # given a place meanwhile, it holds it: `release()` frees it
            with self._lock:
                self._waiters = deque(w for w in self._waiters if w[0] is not ticket)
            raise

    def _enter(self, ticket: Ticket) -> None:
        """A stepped-out ticket takes a place."""
        ticket._place = "in"
        ticket._waiter = None
        self._out -= 1
        self._held += 1
        self.highest_waiting = max(self.highest_waiting, self._waiting())

    def _free(self) -> None:
        """A place is given back: to the longest waiting stepped-out response, else to all."""
        self._held -= 1
        while self._waiters:
            ticket, loop = self._waiters.popleft()
            waiter = ticket._waiter
            if waiter is None or loop.is_closed():
                continue
            self._enter(ticket)
            loop.call_soon_threadsafe(_wake, waiter)
            return


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
