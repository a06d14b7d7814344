"""Admission: the one gate every request passes before its HTTP response starts.

A request reserves its place (running or waiting) in one atomic step when it is accepted; the
reservation is released exactly once, when its generation ends, is cancelled, when the client
leaves before the stream starts, or when preparing it fails. So a burst of simultaneous
requests can never admit more than `slots + max_waiting` of them: the rest are refused at once
(429 with Retry-After), before any of them reaches the engine.

Reasoning summaries are generations inside an admitted request and hold no reservation of their
own: they are bounded by the request that asked for them (one per reasoning segment).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Ticket:
    """One admitted request's place; `release()` may be called any number of times."""

    _gate: Admission
    _released: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._gate._release()

    @property
    def released(self) -> bool:
        return self._released


class Admission:
    """Counts reservations against `slots + max_waiting`; safe to use from any thread."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.bound = slots + max_waiting
        self._lock = threading.Lock()
        self._held = 0
        self.highest_waiting = 0  # the deepest the queue has been since start
        self.refused = 0  # requests turned away because the bound was reached
        self.on_refused: Callable[[], object] | None = None  # e.g. a metrics counter

    def try_acquire(self) -> Ticket | None:
        """A reservation, or None (counted as refused) when the bound is reached."""
        with self._lock:
            full = self._held >= self.bound
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
        """Requests admitted and not finished: running or waiting for a sequence."""
        return self._held

    @property
    def waiting(self) -> int:
        """Admitted requests beyond the sequences: the queue's depth."""
        with self._lock:
            return self._waiting()

    def _waiting(self) -> int:
        return max(0, self._held - self.slots)

    def _release(self) -> None:
        with self._lock:
            self._held -= 1
