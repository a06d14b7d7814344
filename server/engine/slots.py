"""Slots: the llama.cpp sequences, each holding the KV state of one conversation.

A request that continues a conversation goes back to the slot holding it. Any other request goes
to a free slot and takes the longest matching prefix from whichever slot has it — another
conversation with the same system prompt and tools, or an earlier branch of the same one (after a
final answer harmony drops the analysis, so the next prompt diverges there): the prefix is shared
instead of evaluated again, and the other conversation stays intact. Slots whose conversation went
unused the longest are reused first. Pure bookkeeping: the engine applies it to the KV cache.

A conversation may hold its slot with a pin (base.SlotPin: a Responses WebSocket holds one for
its life). A pinned slot is given to no other conversation's prompt: another prompt may share its
prefix (a copy of cells: the slot stays intact) but runs elsewhere, and waits for a slot while
every one it may take is busy. The pin's own prompt goes back to the slot it holds, also where it
does not continue it (after a final answer harmony drops the analysis), instead of taking
another conversation's slot, and the pin follows the conversation to whatever slot it runs in.
Where every slot is pinned by others, the newcomer takes the slot whose pin was used least
recently: the pin yields rather than make the prompt wait, since an open socket may idle for as
long as its client runs (Codex keeps one for a whole session), and as many idle sockets as slots
would otherwise shut every other client out. The conversation that lost its slot evaluates its
next prompt again (or reads it from the prompt cache on disk). Pinned slots are evicted for
room last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from server.engine.base import SlotPin


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share. Two lists are compared a slice at a time (in
    C: token by token, a 35k-token conversation's prompt against its slot costs ≈ 1 ms, twice
    per request, on the engine thread before the prefill), narrowing down to the first
    difference."""
    n = min(len(a), len(b))
    start = 0
    if isinstance(a, list) and isinstance(b, list):
        for step in _STEPS:
            while start < n:
                end = min(start + step, n)
                if a[start:end] != b[start:end]:
                    break
                start = end
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return n


_STEPS = (4096, 128)  # slice lengths of the list comparison, each narrowing the one before


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # whose KV state the sequence holds
    last_used: float = 0.0
    busy: bool = False
    pin: SlotPin | None = None  # the conversation's claim on it, while it is held

    def held_against(self, pin: SlotPin | None) -> bool:
        """Whether a held pin other than `pin` keeps this slot for its conversation."""
        return self.pin is not None and self.pin is not pin and self.pin.held

    @property
    def pinned(self) -> bool:
        return self.pin is not None and self.pin.held


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """Where a prompt runs: its slot, what of the slot's cache it keeps, a prefix to share."""

    slot: Slot
    keep: int  # tokens of the slot's own cache that the prompt starts with
    donor: Slot | None = None  # a slot sharing a longer prefix
    shared: int = 0  # how many tokens to take from the donor


def choose_slot(
    slots: Sequence[Slot], prompt: Sequence[int], pin: SlotPin | None = None
) -> SlotChoice | None:
    """Where `prompt` (of the conversation holding `pin`, if any) should run, or None when it
    must wait: every slot is busy, or every one it may take (see the module's docstring).

    A conversation that continues goes back to its slot, a pinned one to the slot its pin holds.
    Anything else goes to an empty slot (or the least recently used one) and takes the longest
    matching prefix from whichever slot has it: sharing cells costs nothing, and the other
    conversation stays intact. At least one prompt token is always left to evaluate (its logits
    are needed).
    """
    idle = [slot for slot in slots if not slot.busy]
    if not idle:
        return None
    free = [slot for slot in idle if not slot.held_against(pin)]
    if not free:
        if not all(slot.held_against(pin) for slot in slots):
            return None  # a slot no other pin holds is busy: it frees when its generation ends
        free = idle  # every slot is pinned: the least recently used pin yields
    limit = len(prompt) - 1
    prefix = {slot.seq_id: min(common_prefix_length(slot.tokens, prompt), limit) for slot in slots}
    continuing = [s for s in free if s.tokens and prefix[s.seq_id] == min(len(s.tokens), limit)]
    if continuing:
        slot = max(continuing, key=lambda s: prefix[s.seq_id])
        return SlotChoice(slot, prefix[slot.seq_id])
    own = [slot for slot in free if pin is not None and slot.pin is pin]
    empty = [slot for slot in free if not slot.tokens]
    slot = own[0] if own else empty[0] if empty else min(free, key=lambda s: s.last_used)
    keep = prefix[slot.seq_id]
    donor = max(slots, key=lambda s: prefix[s.seq_id])
    if donor is not slot and prefix[donor.seq_id] > keep:
        return SlotChoice(slot, keep, donor, prefix[donor.seq_id])
    return SlotChoice(slot, keep)


def longest_prefix(slots: Sequence[Slot], prompt: Sequence[int]) -> int:
    """The most tokens of `prompt` any slot holds (what the memory can give it)."""
    return max((common_prefix_length(slot.tokens, prompt) for slot in slots), default=0)


def eviction_order(slots: Sequence[Slot]) -> list[Slot]:
    """Idle slots holding a cache, what to drop for room: the unpinned ones first, each kind
    least recently used first."""
    idle = (s for s in slots if not s.busy and s.tokens)
    return sorted(idle, key=lambda s: (s.pinned, s.last_used))
