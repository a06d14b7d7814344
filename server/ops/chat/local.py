"""The chat in this process: the generation core, used as the APIs use it.

Each turn renders the whole conversation into a Transcript and prepares it with the core's
Generator; the Generator's History holds the exact tokens of every message the model sampled,
so earlier answers are replayed as sampled and the engine reuses the KV state of the prompt it
has already evaluated (only the new user message is read).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from server.contracts.errors import ServerError
from server.contracts.events import Finished, FinishReason, SegmentDelta, SegmentEnd, SegmentKind
from server.contracts.transcript import (
    AssistantChannel,
    AssistantMessage,
    Item,
    Transcript,
    UserMessage,
)
from server.core.generation import GenerationOptions, Generator, SamplingDefaults
from server.core.history import History
from server.harmony.render import assistant_start_tokens
from server.ops.chat.turns import Answer, Conversation, Thinking, TurnEnd, TurnEvent, TurnStats
from server.ops.runtime import Runtime
from server.ops.settings import Settings

_SHOWN = {SegmentKind.FINAL: "final", SegmentKind.PREAMBLE: "commentary"}


class LocalChat:
    """A model loaded in this process. Build it on the event loop that runs its turns."""

    def __init__(self, runtime: Runtime, settings: Settings) -> None:
        self.model_name = runtime.model_name
        self._runtime = runtime
        encoding = runtime.encoding
        self.generator = Generator(
            runtime.engine,
            encoding,
            SamplingDefaults(settings.temperature, settings.top_p, seed=settings.seed),
            History(assistant_start_tokens(encoding), settings.history_max_entries),
            strict_tools=settings.strict_tools,
            stream_interval_s=settings.stream_interval_ms / 1000,
        )

    async def turn(self, conversation: Conversation, prompt: str) -> AsyncIterator[TurnEvent]:
        try:
            prepared = self.generator.prepare(transcript(conversation, prompt), GenerationOptions())
        except ServerError as exc:
            yield TurnEnd(complete=False, error=exc.message)
            return
        messages: list[tuple[str, str]] = []
        async for event in prepared.events():
            if isinstance(event, SegmentDelta):
                if event.kind is SegmentKind.REASONING:
                    yield Thinking(event.text)
                elif event.kind in _SHOWN:
                    yield Answer(event.text)
            elif isinstance(event, SegmentEnd) and event.complete and event.kind in _SHOWN:
                messages.append((_SHOWN[event.kind], event.text))
            elif isinstance(event, Finished):
                yield _end(event, tuple(messages))

    async def close(self) -> None:
        """The runtime belongs to whoever loaded it."""


def transcript(conversation: Conversation, prompt: str) -> Transcript:
    """The conversation and the new prompt, as the core reads a request."""
    items: list[Item] = []
    for exchange in conversation.exchanges:
        items.append(UserMessage(exchange.user))
        for channel, text in exchange.messages:
            items.append(AssistantMessage(text, _channel(channel)))
    items.append(UserMessage(prompt))
    return Transcript(
        items=tuple(items),
        instructions=conversation.instructions,
        reasoning_effort=conversation.effort,
        conversation_date=conversation.date,
    )


def _channel(channel: str) -> AssistantChannel:
    return "commentary" if channel == "commentary" else "final"


def _end(finished: Finished, messages: tuple[tuple[str, str], ...]) -> TurnEnd:
    usage, timings = finished.usage, finished.timings
    stats = TurnStats(
        completion_tokens=usage.completion_tokens,
        tokens_per_s=timings.decode_tokens_per_s,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
    )
    complete = finished.reason is FinishReason.STOP and finished.error is None
    return TurnEnd(
        complete=complete,
        messages=messages,
        stats=stats,
        error=finished.error,
        reason=finished.reason.value,
    )
