"""The memory budget of several served models: which loaded models must be unloaded so that
another one can load. Pure: plain data in, a decision out (server.ops.fleet acts on it).

Each model counts its estimate (server.engine.loading.placement's footprint, read from its
GGUF header at its context: weights, KV cache, compute buffer). A model loads when the models
loaded (or loading) beside it and itself fit the budget, and fewer than `max_loaded` are; to
make room, the idle models are unloaded, the least recently used first; a model with requests
in flight (or still loading) never is. A model larger than the whole budget loads alone. When
unloading every idle model would not make room, nothing is unloaded: the load waits until a
busy model goes idle.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Resident(Generic[K]):
    """A model that holds memory now: loaded, or loading."""

    key: K
    cost: int  # bytes, its estimate
    busy: bool  # requests in flight, or loading: never unloaded
    last_used: float  # when it last started or finished a request (monotonic seconds)


def room_for(
    cost: int, residents: Sequence[Resident[K]], budget: int, max_loaded: int | None = None
) -> list[K] | None:
    """The models to unload (least recently used first) so that a model of `cost` bytes can
    load; [] when it fits now; None when it cannot until a busy model goes idle."""
    limit = max_loaded if max_loaded is not None else len(residents) + 1

    def fits(kept: Sequence[Resident[K]]) -> bool:
        if len(kept) + 1 > limit:
            return False
        return not kept if cost > budget else sum(r.cost for r in kept) + cost <= budget

    kept = list(residents)
    if fits(kept):
        return []
    idle = sorted((r for r in residents if not r.busy), key=lambda r: r.last_used)
    unload: list[K] = []
    for victim in idle:
        kept.remove(victim)
        unload.append(victim.key)
        if fits(kept):
            return unload
    return None
