"""The official anthropic SDK against /v1/messages over real HTTP on 127.0.0.1.

The server sends a `ping` after 1 ms without output, so streams carry pings between and inside
blocks: the SDK must cope. Raw streams are also read with httpx and every event is validated
against the SDK's own types (tests.support.anthropic).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import Anthropic
from anthropic.types import Message, MessageParam, ToolParam, ToolUseBlock
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.anthropic import CheckedMessageStream, check_messages_sse
from tests.support.responses import served
from tests.support.scripts import ARITHMETIC, WEATHER_CALL

MODEL = "gpt-oss-tiny"
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}
REASON_THEN_ANSWER = ARITHMETIC
TOOLS: list[ToolParam] = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
WEATHER_ANSWER = "<|channel|>final<|message|>Sunny in Paris.<|return|>"
ASK: list[MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]


def start(root: str, settings: Settings, runtime: Runtime) -> Iterator[str]:
    with served(create_app(settings, runtime)) as url:
        yield url.removesuffix("/v1")


@pytest.fixture(scope="module")
def root(runtime: Runtime) -> Iterator[str]:
    """The server's root URL (the Anthropic SDK adds /v1 itself); pings after 1 ms idle."""
    yield from start("", Settings(messages_ping_s=0.001), runtime)


@pytest.fixture
def sdk(root: str) -> Anthropic:
    return Anthropic(base_url=root, api_key="unused", max_retries=0)


def raw_stream(root: str, **body: Any) -> CheckedMessageStream:
    """POST a streaming request with httpx; every event checked against the SDK's types."""
    payload = {"model": MODEL, "max_tokens": 200, "stream": True, **body}
    with httpx.stream("POST", f"{root}/v1/messages", json=payload, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return check_messages_sse(response.iter_lines())


def comparable(message: Message) -> dict[str, Any]:
    """A message without what differs between two runs of one script (id, cache reuse)."""
    data = message.model_dump(mode="json", exclude={"id"})
    usage = data.pop("usage")
    data["input_total"] = usage["input_tokens"] + (usage["cache_read_input_tokens"] or 0)
    data["output_tokens"] = usage["output_tokens"]
    return data


def test_create_non_streaming(sdk: Anthropic, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    message = sdk.messages.create(
        model=MODEL,
        max_tokens=200,
        thinking=THINKING,
        messages=[{"role": "user", "content": "2+2?"}],
    )
    assert message.id.startswith("msg_")
    assert message.model == MODEL
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["thinking", "text"]
    thinking, text = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "Math."
    assert thinking.signature
    assert text.type == "text"
    assert text.text == "2 + 2 = 4."
    assert message.usage.output_tokens > 0
    assert message.usage.input_tokens > 0
    assert message.usage.cache_creation_input_tokens == 0


def test_stream_helper_accumulates_the_non_streaming_message(
    sdk: Anthropic, forced: ForcedScript
) -> None:
    request: Any = {"model": MODEL, "max_tokens": 200, "thinking": THINKING, "messages": ASK}
    forced.push(WEATHER_CALL)
    created = sdk.messages.create(**request, tools=TOOLS)
    forced.push(WEATHER_CALL)
    with sdk.messages.stream(**request, tools=TOOLS) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert texts == []  # thinking and a call: no text
    assert streamed.stop_reason == created.stop_reason == "tool_use"
    calls = [b for m in (created, streamed) for b in m.content if isinstance(b, ToolUseBlock)]
    assert all(call.id.startswith("toolu_") for call in calls)
    assert len({call.id for call in calls}) == 2  # a fresh id per call
    for call in calls:
        call.id = "toolu_x"
    assert comparable(streamed) == comparable(created)
    assert [b.type for b in streamed.content] == ["thinking", "tool_use"]
    assert streamed.content[1].type == "tool_use"
    assert streamed.content[1].input == {"city": "Paris"}


def test_every_streamed_event_is_an_sdk_event(root: str, forced: ForcedScript) -> None:
    forced.push(
        "<|channel|>analysis<|message|>Think.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Looking it up.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Oslo"}<|call|>'
    )
    checked = raw_stream(root, thinking=THINKING, tools=TOOLS, messages=ASK)
    assert [b["type"] for b in checked.blocks()] == ["thinking", "text", "tool_use"]
    deltas = [p["delta"]["type"] for p in checked.payloads if p["type"] == "content_block_delta"]
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} <= set(deltas)
    assert "ping" in checked.types()
    (delta,) = [p for p in checked.payloads if p["type"] == "message_delta"]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_tool_loop_with_tool_result_reuses_the_cache(sdk: Anthropic, forced: ForcedScript) -> None:
    output = forced.push(WEATHER_CALL)
    before = len(forced.prompts)
    first = sdk.messages.create(
        model=MODEL, max_tokens=200, thinking=THINKING, tools=TOOLS, messages=ASK
    )
    call = next(b for b in first.content if b.type == "tool_use")
    forced.push(WEATHER_ANSWER)
    with sdk.messages.stream(
        model=MODEL,
        max_tokens=200,
        thinking=THINKING,
        tools=TOOLS,
        messages=[
            *ASK,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}],
            },
        ],
    ) as stream:
        answer = stream.get_final_message()
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "Sunny in Paris."
    prompt_one, prompt_two = forced.prompts[before:]
    assert prompt_two[: len(prompt_one) + len(output)] == prompt_one + output
    assert answer.usage.cache_read_input_tokens is not None
    assert answer.usage.cache_read_input_tokens >= len(prompt_one) + len(output) - 1
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == len(prompt_two)


def test_errors_come_in_anthropic_types(sdk: Anthropic, forced: ForcedScript) -> None:
    before = len(forced.prompts)
    bogus: Any = [{"role": "user", "content": [{"type": "bogus"}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(model=MODEL, max_tokens=10, messages=bogus)
    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "bogus" in body["error"]["message"]
    assert len(forced.prompts) == before


def test_count_tokens_is_the_rendered_prompt(sdk: Anthropic, forced: ForcedScript) -> None:
    counted = sdk.messages.count_tokens(model=MODEL, tools=TOOLS, messages=ASK)
    forced.push(WEATHER_ANSWER)
    before = len(forced.prompts)
    sdk.messages.create(model=MODEL, max_tokens=20, tools=TOOLS, messages=ASK)
    assert counted.input_tokens == len(forced.prompts[before])


# ------------------------------------------------------------- thinking sent back, signed


def split_tokens(encoding: HarmonyEncoding, harmony: str) -> list[int]:
    """`harmony` as tokens with the analysis text one character per token: valid output that
    re-encoding its text would never give (BPE merges the characters)."""
    head, text, tail = harmony.partition("Need weather.")
    tokens = encoding.encode(head, allowed_special="all")
    for char in text:
        tokens += encoding.encode(char, allowed_special="all")
    return tokens + encoding.encode(tail, allowed_special="all")


@pytest.fixture(scope="module")
def forgetful_root(runtime: Runtime) -> Iterator[str]:
    """A server whose history keeps one message: only a signature can restore the others."""
    yield from start("", Settings(history_max_entries=1), runtime)


@pytest.mark.parametrize("forged", [False, True], ids=["signed", "forged"])
def test_thinking_sent_back_replays_the_sampled_tokens(
    forgetful_root: str, forced: ForcedScript, encoding: HarmonyEncoding, forged: bool
) -> None:
    sdk = Anthropic(base_url=forgetful_root, api_key="unused", max_retries=0)
    request: Any = {"model": MODEL, "max_tokens": 200, "thinking": THINKING, "tools": TOOLS}
    output = split_tokens(encoding, WEATHER_CALL)
    forced.push_tokens(output)
    before = len(forced.prompts)
    first = sdk.messages.create(**request, messages=ASK)
    forced.push(REASON_THEN_ANSWER)  # another conversation: the history forgets the first
    sdk.messages.create(**request, messages=[{"role": "user", "content": "2+2?"}])
    thinking, call = first.content
    assert thinking.type == "thinking"
    assert call.type == "tool_use"
    assert thinking.thinking == "Need weather."
    sent_back: list[Any] = [thinking.model_dump(), call.model_dump()]
    if forged:
        sent_back[0]["signature"] = sent_back[0]["signature"][:-4] + "AAAA"
    forced.push(WEATHER_ANSWER)
    answer = sdk.messages.create(
        **request,
        messages=[
            *ASK,
            {"role": "assistant", "content": sent_back},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}],
            },
        ],
    )
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "Sunny in Paris."  # a forged signature is no error
    prompt_one, _, prompt_three = forced.prompts[before:]
    extends = prompt_three[: len(prompt_one) + len(output)] == prompt_one + output
    assert extends is not forged  # forged: the thinking is rendered from its text
    prompt = encoding.decode_utf8(prompt_three)
    assert "<|channel|>analysis<|message|>Need weather.<|end|>" in prompt
