"""The fleet: several served models' residencies under one memory budget (server.ops.budget).

A model's residency (server.ops.residency) asks `acquire()` on its worker thread before it loads:
the fleet reserves the model's estimate when it fits beside the models that hold memory, or
unloads the idle ones that the budget names (least recently used first; `evict()` refuses one
that took a request meanwhile, and the plan is made again), or waits until a busy model goes
idle (`changed()`) or one gives its memory back (`release()`). So the models loaded or loading
never hold more than the budget together (or one model alone, when it is larger than the whole
budget), and a model with requests in flight is never unloaded under them.

Lock order: the fleet's lock is never held while a residency's is taken: members are read
without their locks (a snapshot that `evict()` checks again) and call `changed()` and
`release()` after leaving theirs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from server.contracts.errors import EngineUnavailable
from server.ops.budget import Resident, room_for
from server.ops.residency import ModelResidency

log = logging.getLogger(__name__)

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class FleetReport:
    """What /v1/server and /metrics say of the budget."""

    budget_bytes: int
    max_loaded: int | None
    used_bytes: int  # the estimates of the models loaded or loading
    peak_bytes: int  # the most they held together since start
    loaded: tuple[str, ...]  # their names


class ModelFleet:
    """The LoadGate the served models' residencies share."""

    def __init__(self, budget_bytes: int, max_loaded: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.max_loaded = max_loaded
        self._cond = threading.Condition()
        self._costs: dict[ModelResidency, int] = {}
        self._holding: set[ModelResidency] = set()  # loaded or loading: their memory counted
        self._closing = False
        self._peak = 0

    def add(self, member: ModelResidency, cost: int, *, loaded: bool) -> None:
        """A served model, with its estimate; `loaded`: it holds its memory already."""
        with self._cond:
            self._costs[member] = cost
            if loaded:
                self._hold(member)

    def _hold(self, member: ModelResidency) -> None:
        self._holding.add(member)
        self._peak = max(self._peak, sum(self._costs[m] for m in self._holding))

    @property
    def report(self) -> FleetReport:
        with self._cond:
            holding = [m for m in self._costs if m in self._holding]
            used = sum(self._costs[m] for m in holding)
        names = tuple(m.name for m in holding)
        return FleetReport(self.budget_bytes, self.max_loaded, used, self._peak, names)

    # the LoadGate protocol (server.ops.residency)

    def acquire(self, member: ModelResidency) -> None:
        cost = self._costs[member]
        logged = False
        while True:
            with self._cond:
                if self._closing:
                    raise EngineUnavailable("The server is shutting down")
                residents = [
                    Resident(m, self._costs[m], m.busy, m.last_used)
                    for m in self._holding
                    if m is not member
                ]
                victims = room_for(cost, residents, self.budget_bytes, self.max_loaded)
                if victims == []:
                    self._hold(member)
                    return
                if victims is None:
                    if not logged:
                        log.info(
                            "%s waits for memory: %s loaded, in use (budget %.1f GiB, %s needs "
                            "%.1f GiB)",
                            member.name,
                            ", ".join(r.key.name for r in residents),
                            self.budget_bytes / GIB,
                            member.name,
                            cost / GIB,
                        )
                        logged = True
                    self._cond.wait()
                    continue
            evicted = [victim.evict() for victim in victims]  # outside the lock: unloads take time
            if not any(evicted):  # each took a request (or failed) meanwhile: wait for a change
                with self._cond:
                    self._cond.wait(0.5)

    def release(self, member: ModelResidency) -> None:
        with self._cond:
            self._holding.discard(member)
            self._cond.notify_all()

    def changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """The shutdown: loads waiting for room give up."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
