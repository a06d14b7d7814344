"""The terminal chat's conversation, and what one turn streams, whichever way the model is
reached: in this process through the generation core (local.py) or over a running server's
Chat Completions API (remote.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

Effort = Literal["low", "medium", "high"]
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high")


@dataclass(frozen=True, slots=True)
class Thinking:
    """Reasoning text as it is sampled (harmony's analysis channel)."""

    text: str


@dataclass(frozen=True, slots=True)
class Answer:
    """Text shown to the user as it is sampled: the final answer, or a preamble."""

    text: str


@dataclass(frozen=True, slots=True)
class TurnStats:
    """What one generation cost, as the engine measured it."""

    completion_tokens: int = 0
    tokens_per_s: float = 0.0  # decoding, after the first token
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV state was reused, not evaluated


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """The turn's last event. `complete`: the model finished its answer (only such turns join
    the conversation). `messages`: what the model said, as (harmony channel, text)."""

    complete: bool
    messages: tuple[tuple[str, str], ...] = ()
    stats: TurnStats | None = None
    error: str | None = None
    reason: str = ""  # why an incomplete turn ended (length, ...)


TurnEvent = Thinking | Answer | TurnEnd


@dataclass(frozen=True, slots=True)
class Exchange:
    """One finished turn: the user's text and the model's messages (channel, text)."""

    user: str
    messages: tuple[tuple[str, str], ...]


@dataclass
class Conversation:
    """What the next prompt is made of. The date is fixed when the conversation starts, so
    every turn's prompt starts with the same system message (and its KV state is reused)."""

    date: str
    effort: Effort = "medium"
    instructions: str | None = None
    exchanges: list[Exchange] = field(default_factory=list)

    def clear(self, date: str) -> None:
        self.exchanges.clear()
        self.date = date


class ChatBackend(Protocol):
    """A way to reach the model. `turn()` streams one answer to `prompt` after the
    conversation, ending with one TurnEnd (also on errors); closing the iterator early stops
    the generation."""

    model_name: str

    def turn(self, conversation: Conversation, prompt: str) -> AsyncIterator[TurnEvent]: ...

    async def close(self) -> None: ...
