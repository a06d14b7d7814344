"""The call header forms real gpt-oss writes, on the real tiny engine, in all three APIs.

Outputs pasted in public llama.cpp, LM Studio, vLLM and SGLang reports show gpt-oss writing
`<|constrain|>json` with no space before it, calls on the analysis channel, and the content types
`code` and a bare `json`. Forced scripts write exactly those headers: each must come out as a
tool call with its name and arguments, without counting as malformed output; where only the
header is forced, steering must stay on and sample the arguments under the tool's grammar; and
the next round's prompt must replay the call's exact tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.responses import MODEL, responses_client

UNIT = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather.", "parameters": UNIT},
    }
]
HEADERS = {
    "constrain-no-space": "<|channel|>commentary to=functions.get_weather<|constrain|>json",
    "analysis-constrain": "<|channel|>analysis to=functions.get_weather <|constrain|>json",
    "analysis-constrain-no-space": "<|channel|>analysis to=functions.get_weather<|constrain|>json",
    "analysis-plain": "<|channel|>analysis to=functions.get_weather",
    "bare-json": "<|channel|>commentary to=functions.get_weather json",
    "code": "<|channel|>commentary to=functions.get_weather code",
    "role-bare-json": " to=functions.get_weather<|channel|>commentary json",
    "role-analysis-code": " to=functions.get_weather<|channel|>analysis code",
}
ARGUMENTS = '{"unit":"celsius"}'
REASONING = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with responses_client(runtime, tmp_path_factory.mktemp("store")) as test_client:
        yield test_client


def counter(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not in /metrics")


def chat(client: TestClient, text: str, **body: Any) -> dict[str, Any]:
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "tools": CHAT_TOOLS,
        "max_tokens": 60,
        **body,
    }
    response = client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("header", HEADERS.values(), ids=HEADERS.keys())
@pytest.mark.parametrize("reasoning", ["", REASONING], ids=["first", "after-reasoning"])
def test_chat_parses_each_form_as_a_call(
    client: TestClient, forced: ForcedScript, header: str, reasoning: str
) -> None:
    malformed = counter(client, "gpt_oss_malformed_outputs_total")
    forced.push(f"{reasoning}{header}<|message|>{ARGUMENTS}<|call|>")
    body = chat(client, f"Weather? {header}{reasoning}")
    choice = body["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": ARGUMENTS}
    assert choice["finish_reason"] == "tool_calls"
    assert not choice["message"].get("content")
    # steering walked the header as well-formed: the output does not count as malformed
    assert counter(client, "gpt_oss_malformed_outputs_total") == malformed


@pytest.mark.parametrize("header", HEADERS.values(), ids=HEADERS.keys())
def test_steering_stays_on_after_each_form(
    client: TestClient, forced: ForcedScript, header: str
) -> None:
    # only the header is forced: the arguments are sampled for real, under the tool's grammar
    for seed in range(2):
        forced.push(f"{header}<|message|>")
        body = chat(client, f"Weather {seed}? {header}", seed=seed, temperature=1.0)
        choice = body["choices"][0]
        (call,) = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls", choice
        assert json.loads(call["function"]["arguments"])["unit"] in ("celsius", "fahrenheit")


def test_a_call_on_the_analysis_channel_in_messages_and_responses(
    client: TestClient, forced: ForcedScript
) -> None:
    header = HEADERS["analysis-constrain-no-space"]
    malformed = counter(client, "gpt_oss_malformed_outputs_total")
    forced.push(f"{REASONING}{header}<|message|>{ARGUMENTS}<|call|>")
    response = client.post(
        "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "Weather, Messages?"}],
            "tools": [{"name": "get_weather", "input_schema": UNIT}],
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    (use,) = [block for block in body["content"] if block["type"] == "tool_use"]
    assert (use["name"], use["input"]) == ("get_weather", {"unit": "celsius"})
    assert body["stop_reason"] == "tool_use"

    forced.push(f"{REASONING}{header}<|message|>{ARGUMENTS}<|call|>")
    response = client.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "Weather, Responses?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": UNIT}],
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    (call,) = [item for item in body["output"] if item["type"] == "function_call"]
    assert (call["name"], call["arguments"]) == ("get_weather", ARGUMENTS)
    assert [item["type"] for item in body["output"]] == ["reasoning", "function_call"]
    assert counter(client, "gpt_oss_malformed_outputs_total") == malformed


@pytest.mark.parametrize("name", ["analysis-constrain-no-space", "role-analysis-code"])
def test_the_next_round_replays_the_exact_call_tokens(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding, name: str
) -> None:
    sampled = forced.push(f"{REASONING}{HEADERS[name]}<|message|>{ARGUMENTS}<|call|>")
    question = {"role": "user", "content": f"Weather, replay {name}?"}
    first = chat(client, question["content"])
    message = first["choices"][0]["message"]
    forced.push("<|channel|>final<|message|>Sunny.<|return|>")
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "20C"}
    chat(client, "", messages=[question, message, result])
    prompt = forced.prompts[-1]
    # the first round's prompt, then exactly the sampled tokens (reasoning and call), then the
    # tool's result: byte for byte what the model saw and wrote
    before = forced.prompts[-2]
    assert prompt[: len(before) + len(sampled)] == before + sampled
    tail = encoding.decode_utf8(prompt[len(before) + len(sampled) :])
    assert tail.startswith("<|start|>functions.get_weather to=assistant<|channel|>commentary")
