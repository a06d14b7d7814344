"""Tool calling through the openai SDK: streamed calls, a 3-round loop with KV reuse, CoT rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionFunctionToolParam
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript

WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def call_script(thought: str, city: str) -> str:
    return (
        f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant<|channel|>commentary"
        f' to=functions.get_weather <|constrain|>json<|message|>{{"city":"{city}"}}<|call|>'
    )


def final_script(thought: str, answer: str) -> str:
    return (
        f"<|channel|>analysis<|message|>{thought}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{answer}<|return|>"
    )


@pytest.fixture
def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def as_message(message: Any) -> dict[str, Any]:
    """What an SDK user sends back: the assistant message as returned (extra fields included)."""
    return dict(message.model_dump(exclude_none=True))


def test_three_round_tool_loop_reuses_the_kv_cache(
    sdk: OpenAI, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris and in Rome?"},
    ]
    forced.push(call_script("Need Paris first.", "Paris"))
    forced.push(call_script("Now Rome.", "Rome"))
    forced.push(final_script("Both known.", "Paris 21°C, Rome 25°C."))
    rounds = []
    for output in ('{"temp_c": 21}', '{"temp_c": 25}', None):
        completion = sdk.chat.completions.create(
            model="gpt-oss-tiny", messages=messages, tools=[WEATHER_TOOL]
        )
        rounds.append(completion)
        message = completion.choices[0].message
        messages.append(as_message(message))
        if output is None:
            break
        assert completion.choices[0].finish_reason == "tool_calls"
        assert message.tool_calls is not None
        (call,) = message.tool_calls
        messages.append({"role": "tool", "tool_call_id": call.id, "content": output})

    first, second, third = rounds
    assert first.choices[0].message.tool_calls[0].function.arguments == '{"city":"Paris"}'  # type: ignore[index, union-attr]
    assert second.choices[0].message.tool_calls[0].function.arguments == '{"city":"Rome"}'  # type: ignore[index, union-attr]
    assert third.choices[0].message.content == "Paris 21°C, Rome 25°C."
    for previous, current in ((first, second), (second, third)):
        assert previous.usage is not None
        assert current.usage is not None
        assert current.usage.prompt_tokens_details is not None
        # everything the previous round saw and sampled is reused; its last sampled token was
        # never evaluated, so it is evaluated with the new tokens
        expected = previous.usage.prompt_tokens + previous.usage.completion_tokens - 1
        assert current.usage.prompt_tokens_details.cached_tokens == expected
    # the analysis of the current tool chain stays in the prompt of each round
    last_prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "Need Paris first." in last_prompt
    assert "Now Rome." in last_prompt
    # after the final answer, the next turn drops every analysis of the finished turn
    messages.append({"role": "user", "content": "Thanks!"})
    forced.push(final_script("Polite.", "You're welcome."))
    sdk.chat.completions.create(model="gpt-oss-tiny", messages=messages, tools=[WEATHER_TOOL])
    next_prompt = encoding.decode_utf8(forced.prompts[-1])
    for thought in ("Need Paris first.", "Now Rome.", "Both known."):
        assert thought not in next_prompt
    assert "Paris 21°C, Rome 25°C." in next_prompt


def test_streamed_tool_call_fragments(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(call_script("Call it.", "Oslo"))
    stream = sdk.chat.completions.create(
        model="gpt-oss-tiny",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    fragments: list[ChoiceDeltaToolCall] = []
    reasoning: list[str] = []
    finish: list[str] = []
    chunk: ChatCompletionChunk
    for chunk in stream:
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning") or "")
            fragments.extend(choice.delta.tool_calls or [])
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert "".join(reasoning) == "Call it."
    assert finish == ["tool_calls"]
    first, *rest = fragments
    assert first.index == 0
    assert first.id
    assert first.id.startswith("call_")
    assert first.type == "function"
    assert first.function is not None
    assert first.function.name == "get_weather"
    assert rest
    assert all(f.id is None and f.index == 0 for f in rest)
    arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
    assert json.loads(arguments) == {"city": "Oslo"}


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_round_trips_under_both_names(
    sdk: OpenAI, forced: ForcedScript, encoding: HarmonyEncoding, field: str
) -> None:
    messages: list[Any] = [
        {"role": "user", "content": f"Weather in {field}?"},
        {
            "role": "assistant",
            "content": None,
            field: f"THOUGHT-{field}",
            "tool_calls": [
                {
                    "id": f"call_client_{field}",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"X"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_client_{field}", "content": "sunny"},
    ]
    forced.push(final_script("ok", "Sunny."))
    sdk.chat.completions.create(model="gpt-oss-tiny", messages=messages, tools=[WEATHER_TOOL])
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert f"<|channel|>analysis<|message|>THOUGHT-{field}<|end|>" in prompt


def test_omitted_reasoning_is_restored_by_call_id(
    sdk: OpenAI, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Lima?"}]
    forced.push(call_script("SECRET-PLAN for Lima.", "Lima"))
    completion = sdk.chat.completions.create(
        model="gpt-oss-tiny", messages=messages, tools=[WEATHER_TOOL]
    )
    message = as_message(completion.choices[0].message)
    for name in ("reasoning", "reasoning_content", "reasoning_details"):
        message.pop(name, None)  # a client that drops reasoning between tool rounds
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": "cloudy"}]
    forced.push(final_script("ok", "Cloudy."))
    second = sdk.chat.completions.create(
        model="gpt-oss-tiny", messages=messages, tools=[WEATHER_TOOL]
    )
    assert "SECRET-PLAN for Lima." in encoding.decode_utf8(forced.prompts[-1])
    assert completion.usage is not None
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    expected = completion.usage.prompt_tokens + completion.usage.completion_tokens - 1
    assert second.usage.prompt_tokens_details.cached_tokens == expected


def test_cot_drop_after_a_final_answer_is_the_only_cache_miss(
    sdk: OpenAI, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me a fact about otters."}]
    forced.push(final_script("Otters hold hands.", "Otters hold hands while sleeping."))
    first = sdk.chat.completions.create(model="gpt-oss-tiny", messages=messages)
    first_prompt = forced.prompts[-1]
    messages += [as_message(first.choices[0].message), {"role": "user", "content": "Another?"}]
    forced.push(final_script("Sea otters.", "They use rocks as tools."))
    second = sdk.chat.completions.create(model="gpt-oss-tiny", messages=messages)
    second_prompt = forced.prompts[-1]
    # the new prompt repeats the old one, then `<|channel|>` of the answer: the dropped analysis
    # (which started `<|channel|>analysis`) is where it diverges, and nowhere else
    assert second_prompt[: len(first_prompt)] == first_prompt
    diverge = len(first_prompt) + 1
    assert encoding.decode_utf8(
        first_prompt[-2:] + second_prompt[len(first_prompt) : diverge + 1]
    ) == ("<|start|>assistant<|channel|>final")
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == diverge
