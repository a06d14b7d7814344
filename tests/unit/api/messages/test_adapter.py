"""The Messages adapter: request -> Transcript and GenerationOptions; signed thinking."""

from __future__ import annotations

from typing import Any

import pytest

from server.api.messages.adapter import (
    call_id,
    generation_options,
    to_tool_choice,
    to_transcript,
    tool_use_id,
)
from server.api.messages.schemas import MessagesRequest
from server.api.messages.signature import ThinkingSigner
from server.contracts.errors import InvalidRequest
from server.contracts.transcript import (
    AssistantMessage,
    Reasoning,
    ToolCall,
    ToolChoice,
    ToolResult,
    UserMessage,
)

SIGNER = ThinkingSigner(b"s" * 32)
TOOL = {"name": "Bash", "input_schema": {"type": "object"}}


def request(**body: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 9, **body})


def test_ids_map_both_ways() -> None:
    assert tool_use_id("call_abc") == "toolu_abc"
    assert call_id("toolu_abc") == "call_abc"
    assert call_id(tool_use_id("call_x1")) == "call_x1"
    assert call_id("other-id") == tool_use_id("other-id") == "other-id"


def test_an_assistant_turn_becomes_reasoning_preamble_call_and_result() -> None:
    tokens = (1, 2, 3)
    signature = SIGNER.sign("Think.", tokens)
    assistant = [
        {"type": "thinking", "thinking": "Think.", "signature": signature},
        {"type": "text", "text": "Running it."},
        {"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": {"command": "ls"}},
        {"type": "redacted_thinking", "data": "opaque"},
    ]
    result = {"type": "tool_result", "tool_use_id": "toolu_9", "content": "a\nb"}
    transcript = to_transcript(
        request(
            tools=[TOOL, {"type": "web_search_20250305", "name": "web_search"}],
            messages=[
                {"role": "user", "content": "List files."},
                {"role": "assistant", "content": assistant},
                {"role": "user", "content": [result, {"type": "text", "text": "Then?"}]},
            ],
        ),
        "medium",
        "2026-01-02",
        SIGNER,
    )
    assert [spec.name for spec in transcript.tools] == ["Bash"]  # server tools not offered
    assert transcript.items == (
        UserMessage("List files."),
        Reasoning("Think.", tokens=tokens),
        AssistantMessage("Running it.", channel="commentary"),
        ToolCall("call_9", "Bash", '{"command":"ls"}'),
        ToolResult("call_9", "a\nb", "Bash"),
        UserMessage("Then?"),
    )


@pytest.mark.parametrize(
    "signature",
    ["", "garbage!", SIGNER.sign("Other text.", (1, 2)), ThinkingSigner().sign("Think.", (1, 2))],
    ids=["empty", "garbage", "other-text", "other-key"],
)
def test_an_unverified_signature_restores_nothing(signature: str) -> None:
    block = {"type": "thinking", "thinking": "Think.", "signature": signature}
    transcript = to_transcript(
        request(
            messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": [block]}]
        ),
        "medium",
        "2026-01-02",
        SIGNER,
    )
    assert transcript.items[1] == Reasoning("Think.")


def test_options() -> None:
    options = generation_options(
        request(
            messages=[{"role": "user", "content": "x"}],
            thinking={"type": "enabled", "budget_tokens": 1500},
            stop_sequences=["END"],
            temperature=0.2,
            top_k=5,
        )
    )
    assert options.max_tokens == 9
    assert options.reasoning_budget == 1500
    assert options.stop == ("END",)
    assert (options.temperature, options.top_k) == (0.2, 5)
    adaptive = generation_options(
        request(messages=[{"role": "user", "content": "x"}], thinking={"type": "adaptive"})
    )
    assert adaptive.reasoning_budget is None


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, ToolChoice()),
        ({"type": "auto", "disable_parallel_tool_use": True}, ToolChoice()),
        ({"type": "none"}, ToolChoice(mode="none")),
        ({"type": "any"}, ToolChoice(mode="required")),
        ({"type": "tool", "name": "Bash"}, ToolChoice(mode="named", name="Bash")),
    ],
)
def test_tool_choice(choice: dict[str, Any] | None, expected: ToolChoice) -> None:
    assert to_tool_choice(choice) == expected


@pytest.mark.parametrize("choice", [{"type": "tool"}, {"type": "required"}, {}])
def test_bad_tool_choice(choice: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        to_tool_choice(choice)


def test_signatures_survive_only_with_their_text_and_key() -> None:
    tokens = tuple(range(200_000, 200_020))
    signature = SIGNER.sign("é ✓ text", tokens)
    assert SIGNER.tokens("é ✓ text", signature) == tokens
    assert SIGNER.tokens("é ✓ text!", signature) is None
    assert SIGNER.tokens("é ✓ text", signature[:-2]) is None
    assert not ThinkingSigner().verify("é ✓ text", signature)
    assert SIGNER.verify("", SIGNER.sign(""))
