"""Slots: the llama.cpp sequences, each holding the KV state of one conversation.

A request that continues a conversation goes back to the slot holding it. Any other request goes
to a free slot and takes the longest matching prefix from whichever slot has it — another
conversation with the same system prompt and tools, or an earlier branch of the same one (after a
final answer harmony drops the analysis, so the next prompt diverges there): the prefix is shared
instead of evaluated again, and the other conversation stays intact. Slots whose conversation went
unused the longest are reused first. Pure bookkeeping: the engine applies it to the KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


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


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """Where a prompt runs: its slot, what of the slot's cache it keeps, a prefix to share."""

    slot: Slot
    keep: int  # tokens of the slot's own cache that the prompt starts with
    donor: Slot | None = None  # a slot sharing a longer prefix
    shared: int = 0  # how many tokens to take from the donor


def choose_slot(slots: Sequence[Slot], prompt: Sequence[int]) -> SlotChoice | None:
    """Where `prompt` should run, or None when every slot is busy.

    A conversation that continues goes back to its slot. Anything else goes to an empty slot (or
    the least recently used one) and takes the longest matching prefix from whichever slot has
    it: sharing cells costs nothing, and the other conversation stays intact. At least one prompt
    token is always left to evaluate (its logits are needed).
    """
    idle = [slot for slot in slots if not slot.busy]
    if not idle:
        return None
    limit = len(prompt) - 1
    prefix = {slot.seq_id: min(common_prefix_length(slot.tokens, prompt), limit) for slot in slots}
    continuing = [s for s in idle if s.tokens and prefix[s.seq_id] == min(len(s.tokens), limit)]
    if continuing:
        slot = max(continuing, key=lambda s: prefix[s.seq_id])
        return SlotChoice(slot, prefix[slot.seq_id])
    empty = [slot for slot in idle if not slot.tokens]
    slot = empty[0] if empty else min(idle, key=lambda s: s.last_used)
    keep = prefix[slot.seq_id]
    donor = max(slots, key=lambda s: prefix[s.seq_id])
    if donor is not slot and prefix[donor.seq_id] > keep:
        return SlotChoice(slot, keep, donor, prefix[donor.seq_id])
    return SlotChoice(slot, keep)


def longest_prefix(slots: Sequence[Slot], prompt: Sequence[int]) -> int:
    """The most tokens of `prompt` any slot holds (what the memory can give it)."""
    return max((common_prefix_length(slot.tokens, prompt) for slot in slots), default=0)


def eviction_order(slots: Sequence[Slot]) -> list[Slot]:
    """Idle slots holding a cache, least recently used first: what to drop for room."""
    return sorted((s for s in slots if not s.busy and s.tokens), key=lambda s: s.last_used)
