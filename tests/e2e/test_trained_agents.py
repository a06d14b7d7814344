"""Unscripted tool use on the trained tiny gpt-oss through the real SDKs (openai, anthropic).

Nothing is forced (tests/support/trained.py); the server is greedy and its steering is on. The
values the model must copy are words from the held-out part of the training vocabulary: the
corpus never used them (scripts/train_tiny/corpus.py splits the word pool by hash).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding

from tests.support.trained import MODEL, TrainedServer, trained_server

pytestmark = pytest.mark.slow  # builds the trained GGUF once per machine

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
LOOKUP = {
    "name": "lookup_user",
    "description": "Find a user by name.",
    "parameters": {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    },
}


def held_out_words(n: int) -> list[str]:
    """The first n held-out words of a fixed list of plain words."""
    candidates = [
        "silver", "island", "pepper", "chalk", "deliver", "welcome", "rectangle", "nickname",
        "venue", "stocks", "pricing", "inject", "visit", "sections", "academy", "active",
    ]  # fmt: skip
    words = [w for w in candidates if hashlib.sha256(w.encode()).digest()[0] % 10 == 0]
    assert len(words) >= n, words
    return words[:n]


@pytest.fixture(scope="module")
def server(
    encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrainedServer]:
    with trained_server(encoding, tmp_path_factory.mktemp("store"), 4096) as running:
        yield running


@pytest.fixture
def sdk(server: TrainedServer) -> OpenAI:
    return OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def chat_tool(spec: dict[str, Any]) -> Any:
    return {"type": "function", "function": spec}


def test_chat_tool_loop_calls_copies_and_answers_with_the_result(sdk: OpenAI) -> None:
    city, result = held_out_words(2)
    messages: list[Any] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    first = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=[chat_tool(WEATHER), chat_tool(LOOKUP)]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": city}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    second = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=[chat_tool(WEATHER), chat_tool(LOOKUP)]
    )
    assert second.choices[0].finish_reason == "stop"
    assert result in (second.choices[0].message.content or "")


def test_named_tool_choice_on_chat(sdk: OpenAI) -> None:
    (name,) = held_out_words(1)
    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Look up the user {name}."}],
        tools=[chat_tool(WEATHER), chat_tool(LOOKUP)],
        tool_choice={"type": "function", "function": {"name": "lookup_user"}},
        max_tokens=300,
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "lookup_user"
    assert json.loads(call.function.arguments) == {"name": name}


def test_named_tool_choice_on_responses(sdk: OpenAI) -> None:
    (name,) = held_out_words(1)
    response = sdk.responses.create(  # type: ignore[call-overload]
        model=MODEL,
        input=f"Look up the user {name}.",
        tools=[{"type": "function", **WEATHER}, {"type": "function", **LOOKUP}],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "lookup_user"},
        max_output_tokens=300,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["lookup_user"]
    assert json.loads(calls[0].arguments) == {"name": name}


def test_named_tool_choice_on_messages(server: TrainedServer) -> None:
    (name,) = held_out_words(1)
    client = anthropic.Anthropic(
        base_url=server.url.removesuffix("/v1"), api_key="unused", max_retries=0
    )
    message = client.messages.create(  # type: ignore[call-overload]
        model=MODEL,
        max_tokens=300,
        messages=[{"role": "user", "content": f"Look up the user {name}."}],
        tools=[
            {"name": s["name"], "description": s["description"], "input_schema": s["parameters"]}
            for s in (WEATHER, LOOKUP)
        ],  # type: ignore[misc]
        tool_choice={"type": "tool", "name": "lookup_user"},
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert [u.name for u in uses] == ["lookup_user"]
    assert uses[0].input == {"name": name}
