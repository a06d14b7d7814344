"""Unscripted tool use on the trained tiny gpt-oss through the real SDKs (openai, anthropic).

What the committed model does reliably is checked (the right tool, a call within 300 tokens,
schema-valid arguments); copying the user's values exactly is what it does not do yet: those
tests are strict xfails, which fail as soon as a retrained model passes them.

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


COPYING = pytest.mark.xfail(
    strict=True,
    reason="the committed model (160 training steps) calls the right tool with schema-valid "
    "arguments but does not copy values yet: docs/trained-model.md",
)


def chat_call(sdk: OpenAI, user: str, tool_choice: Any = "auto") -> tuple[str, dict[str, Any]]:
    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": user}],
        tools=[chat_tool(WEATHER), chat_tool(LOOKUP)],
        tool_choice=tool_choice,
        max_tokens=300,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    return call.function.name, json.loads(call.function.arguments)


def test_chat_the_model_calls_the_tool_the_user_asks_for(sdk: OpenAI) -> None:
    (city,) = held_out_words(1)
    name, arguments = chat_call(sdk, f"What is the weather in {city}?")
    assert name == "get_weather"
    assert list(arguments) == ["city"]
    assert isinstance(arguments["city"], str)


@COPYING
def test_chat_tool_loop_copies_the_argument_and_quotes_the_result(sdk: OpenAI) -> None:
    city, result = held_out_words(2)
    messages: list[Any] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    tools = [chat_tool(WEATHER), chat_tool(LOOKUP)]
    first = sdk.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=300)
    choice = first.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert json.loads(call.function.arguments) == {"city": city}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    second = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=300
    )
    assert second.choices[0].finish_reason == "stop"
    assert result in (second.choices[0].message.content or "")


def test_named_tool_choice_on_chat(sdk: OpenAI) -> None:
    (name,) = held_out_words(1)
    choice = {"type": "function", "function": {"name": "lookup_user"}}
    tool, arguments = chat_call(sdk, f"Look up the user {name}.", choice)
    assert tool == "lookup_user"
    assert isinstance(arguments["name"], str)


@COPYING
def test_named_tool_choice_copies_the_argument(sdk: OpenAI) -> None:
    (name,) = held_out_words(1)
    choice = {"type": "function", "function": {"name": "lookup_user"}}
    assert chat_call(sdk, f"Look up the user {name}.", choice) == ("lookup_user", {"name": name})


def test_named_tool_choice_on_responses(sdk: OpenAI) -> None:
    (name,) = held_out_words(1)
    response = sdk.responses.create(  # type: ignore[call-overload]
        model=MODEL,
        input=f"Look up the user {name}.",
        tools=[{"type": "function", **WEATHER}, {"type": "function", **LOOKUP}],
        tool_choice={"type": "function", "name": "lookup_user"},
        max_output_tokens=300,
    )
    assert response.status == "completed"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["lookup_user"]
    assert isinstance(json.loads(calls[0].arguments)["name"], str)


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
        ],
        tool_choice={"type": "tool", "name": "lookup_user"},
    )
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert [u.name for u in uses] == ["lookup_user"]
    assert isinstance(uses[0].input["name"], str)
