"""Steering directives: how a steering (harmony's grammar) tells the engine what to sample.

The contract between the two sides that must not know each other: `server.harmony.steering`
produces these directives, `server.engine` follows them. Nothing here imports either side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Force:
    """Emit these tokens next, without sampling."""

    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Allow:
    """Sample the next token among these only (small sets: sampled in Python from the logits)."""

    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Constrain:
    """Sample with llama.cpp's sampler, never picking `banned`, following `grammar` (GBNF).

    A grammar starts when a directive first names it and follows every token sampled under it.
    """

    banned: frozenset[int] = frozenset()
    grammar: str | None = None


Directive = Force | Allow | Constrain | None


@dataclass(frozen=True, slots=True)
class SteeringStats:
    """How far one generation's steering pushed the model, counted by the engine.

    `choices`: tokens sampled under an `Allow` directive; `overrides`: those of them where the
    model's most likely token (the argmax of its logits) lay outside the allowed set, so the
    steering, not the model, decided. On real weights a high share means the grammar refuses
    what the model writes.
    """

    choices: int = 0
    overrides: int = 0


class Steering(Protocol):
    """Per-generation control of sampling; called on the engine thread, so it must be cheap."""

    def next(self) -> Directive:
        """What to do for the next token."""
        ...

    def accept(self, token: int) -> None:
        """The token that was emitted (sampled, forced, or chosen by a test hook)."""
        ...

    def likely(self) -> tuple[int, ...]:
        """The tokens most likely to come next when the next one is the model's choice (a
        header's usual path), or (): a guess the engine may evaluate ahead, with logits, and
        keep only while its own picks match it."""
        ...
