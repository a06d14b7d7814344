"""Several choices (`n` > 1): one generation per choice, side by side in the engine's batch,
their chat events merged into one stream or one body (the shared tail's `merged` and
`respond_all`: server/api/stream_run.py).

Each choice has its own emitter (its chunks carry its `index`); the merged stream passes every
choice's chunks as they come, holds back each choice's `[DONE]` and usage chunk, and ends with
one usage chunk (if asked for) and one `[DONE]`; a failed choice ends the stream with its error.
The body lists the folded choices in order, with the usage of all of them (the prompt counted
once, as OpenAI does).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

from server.api.chat.emitter import ChatEmitter, ChatEvent, ChatFailed, fold
from server.api.chat.schemas import ChatCompletion, ChatCompletionChunk, UsageOut
from server.api.stream_run import merged


async def merged_stream(
    sources: Sequence[AsyncIterator[ChatEvent]], emitters: Sequence[ChatEmitter]
) -> AsyncIterator[ChatEvent]:
    """The chunks of every choice, then one usage chunk (if asked for) and one `[DONE]`."""
    async with aclosing(merged(sources)) as every:  # a failed choice stops the others
        async for _, event in every:
            if event == "[DONE]":
                continue
            if isinstance(event, ChatFailed):
                yield event
                break
            if isinstance(event, dict) and event.get("usage") is not None:
                continue  # summed at the end
            yield event
        else:
            if emitters[0].include_usage:
                yield _usage_chunk(emitters)
    yield "[DONE]"


def _usage_chunk(emitters: Sequence[ChatEmitter]) -> ChatCompletionChunk:
    first = emitters[0]
    assert first.finished is not None
    chunk = first.factory.usage_chunk(first.finished)
    chunk["usage"] = total_usage(emitters)
    return chunk


def total_usage(emitters: Sequence[ChatEmitter]) -> UsageOut:
    """The choices' usage: their completions summed, the prompt once."""
    usages = [e.usage() for e in emitters]
    total = usages[0]
    completion = sum(u["completion_tokens"] for u in usages)
    reasoning = sum(u["completion_tokens_details"]["reasoning_tokens"] for u in usages)
    return UsageOut(
        prompt_tokens=total["prompt_tokens"],
        completion_tokens=completion,
        total_tokens=total["prompt_tokens"] + completion,
        prompt_tokens_details=total["prompt_tokens_details"],
        completion_tokens_details={"reasoning_tokens": reasoning},
    )


def folded(events: Sequence[list[ChatEvent]], emitters: Sequence[ChatEmitter]) -> ChatCompletion:
    """The body of every choice: the first's, with every choice's folded choice in order."""
    bodies = [
        fold(choice_events, emitter)
        for choice_events, emitter in zip(events, emitters, strict=True)
    ]
    body = bodies[0]
    body["choices"] = [b["choices"][0] for b in bodies]
    if "usage" in body:
        body["usage"] = total_usage(emitters)
    return body
