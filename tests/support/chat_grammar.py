"""The Chat Completions streaming grammar, checked over a whole stream of `data:` payloads.

    stream := role-chunk delta-chunk* finish-chunk usage-chunk? [DONE]
            | role-chunk delta-chunk* error-envelope [DONE]   (the generation failed)
            | role-chunk delta-chunk*                         (cancelled: the client left)

plus: every chunk validates against the openai SDK's own `ChatCompletionChunk`; all chunks share
one id, creation time and model; exactly one chunk carries a finish_reason; tool-call fragments
open their call (index, id, type, name) before adding arguments, and indexes count from 0.
The merged stream is returned so a caller can compare it with the non-streaming body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk


@dataclass
class ChatStream:
    """What a checked stream said, merged: the non-streaming body must say the same."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # id, name, arguments
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # the error envelope that ended the stream


def check_chat_stream(payloads: list[str], *, cancelled: bool = False) -> ChatStream:
    """Assert the grammar over the `data:` payloads of one stream, in order.

    `cancelled`: the client left, so the stream just stops (nobody reads a terminal chunk).
    """
    assert payloads, "empty stream"
    merged = ChatStream()
    body = payloads
    if not cancelled:
        assert payloads[-1] == "[DONE]", "a stream ends with [DONE]"
        body = payloads[:-1]
        assert body, "no chunks"
        last = json.loads(body[-1])
        if "error" in last:
            merged.error = last["error"]
            assert merged.error["message"], merged.error
            assert merged.error["type"], merged.error
            body = body[:-1]
    chunks = [ChatCompletionChunk.model_validate_json(data) for data in body]
    assert chunks, "no chunks"
    first = chunks[0]
    assert first.choices, "no role chunk first"
    assert first.choices[0].delta.role == "assistant", "no role chunk first"
    for chunk in chunks:
        assert (chunk.id, chunk.created, chunk.model) == (first.id, first.created, first.model)
    finishes = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    if cancelled:
        assert payloads[-1] != "[DONE]", "a cancelled stream just stops"
        assert finishes == [], "a cancelled stream just stops"
    elif merged.error is None:
        assert len(finishes) == 1, f"finish_reason in chunks {finishes}"
        rest = chunks[finishes[0] + 1 :]
        assert all(not c.choices and c.usage is not None for c in rest), "chunks after finish"
        assert len(rest) <= 1
        merged.finish_reason = chunks[finishes[0]].choices[0].finish_reason
        if rest:
            usage = rest[0].usage
            assert usage is not None
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            merged.usage = usage.model_dump()
    else:
        assert finishes == [], "an errored stream has no finish_reason"
    for chunk in chunks:
        for choice in chunk.choices:
            _merge(merged, choice.delta.model_dump())
    return merged


def _merge(merged: ChatStream, delta: dict[str, Any]) -> None:
    merged.content += delta.get("content") or ""
    merged.reasoning += delta.get("reasoning") or ""
    if delta.get("reasoning_content") is not None:
        assert delta["reasoning_content"] == delta.get("reasoning"), "reasoning names differ"
    for fragment in delta.get("tool_calls") or []:
        function = fragment.get("function") or {}
        index = fragment["index"]
        if fragment.get("id"):
            assert index == len(merged.tool_calls), "tool call indexes must count from 0"
            assert fragment.get("type") == "function"
            assert function.get("name") is not None, "a call opens with its name"
            merged.tool_calls.append(
                {"id": fragment["id"], "name": function["name"], "arguments": ""}
            )
        assert 0 <= index == len(merged.tool_calls) - 1, "arguments for a call not open"
        merged.tool_calls[index]["arguments"] += function.get("arguments") or ""


def check_chat_body(body: dict[str, Any], streamed: ChatStream | None = None) -> ChatCompletion:
    """A non-streaming body: the SDK type, and (given the stream) the same content."""
    completion = ChatCompletion.model_validate(body)
    (choice,) = completion.choices
    message = choice.message
    assert message.role == "assistant"
    if streamed is not None:
        assert (message.content or "") == streamed.content
        extra = message.model_extra or {}
        assert (extra.get("reasoning") or "") == streamed.reasoning
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls or []
            if c.type == "function"
        ]
        assert calls == streamed.tool_calls
        assert choice.finish_reason == streamed.finish_reason
    return completion
