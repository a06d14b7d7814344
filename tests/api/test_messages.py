"""/v1/messages in-process on the real tiny engine: mapping, visibility, stop reasons, auth.

Outputs are forced scripts; every streamed event goes through the SDK-typed checker, every
non-streaming body validates as the SDK's `Message`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types import Message
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.anthropic import CheckedMessageStream, check_messages_sse
from tests.support.scripts import WEATHER_CALL, reason_then_answer

MODEL = "gpt-oss-tiny"
RAW = "SECRET-COT-42 the user greets."
REASON_THEN_ANSWER = reason_then_answer(RAW, "Hello!")
SUMMARY_TEXT = "**Greeting** The user says hello."
SUMMARY = f"<|channel|>final<|message|>{SUMMARY_TEXT}<|return|>"
HI = [{"role": "user", "content": "Hi"}]
THINKING = {"type": "enabled", "budget_tokens": 2048}
TOOL = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def app_client(runtime: Runtime, **settings: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(**settings), runtime)) as client:
        yield client


@pytest.fixture(scope="module")
def client(runtime: Runtime) -> Iterator[TestClient]:
    yield from app_client(runtime)


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 100, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    Message.model_validate(data)
    return data


def stream(client: TestClient, **body: Any) -> CheckedMessageStream:
    payload = {"model": MODEL, "max_tokens": 100, "stream": True, **body}
    with client.stream("POST", "/v1/messages?beta=true", json=payload) as response:
        assert response.status_code == 200, response.read()
        return check_messages_sse(response.iter_lines())


def prompt_text(forced: ForcedScript, encoding: HarmonyEncoding, index: int = -1) -> str:
    return encoding.decode_utf8(forced.prompts[index])


def test_system_blocks_and_messages_render_in_order(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    create(
        client,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            },
            {"role": "assistant", "content": "Earlier answer."},
            {"role": "system", "content": [{"type": "text", "text": "Tools changed."}]},
            {"role": "user", "content": "C"},
        ],
    )
    prompt = prompt_text(forced, encoding)
    assert "# Instructions\n\nBe brief.\n\nBe kind." in prompt
    assert "<|start|>user<|message|>A\nB<|end|>" in prompt
    assert "<|start|>assistant<|channel|>final<|message|>Earlier answer.<|end|>" in prompt
    assert "<|start|>developer<|message|>Tools changed.<|end|>" in prompt
    assert prompt.endswith("<|start|>user<|message|>C<|end|><|start|>assistant")


@pytest.mark.parametrize(
    ("settings", "effort"),
    [
        ({}, "medium"),  # the server's default
        ({"thinking": {"type": "disabled"}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 10000}}, "high"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, "low"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
    ],
)
def test_thinking_and_effort_set_the_reasoning_effort(
    client: TestClient,
    forced: ForcedScript,
    encoding: HarmonyEncoding,
    settings: dict[str, Any],
    effort: str,
) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    create(client, messages=HI, **settings)
    assert f"Reasoning: {effort}" in prompt_text(forced, encoding)


def test_no_thinking_asked_no_thinking_blocks(client: TestClient, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    message = create(client, messages=HI)
    assert [block["type"] for block in message["content"]] == ["text"]
    assert RAW not in str(message)


def test_omitted_display_sends_the_signature_only(client: TestClient, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    checked = stream(client, messages=HI, thinking={"type": "adaptive", "display": "omitted"})
    assert [b["type"] for b in checked.blocks()] == ["thinking", "text"]
    deltas = [p["delta"] for p in checked.payloads if p["type"] == "content_block_delta"]
    assert [d["type"] for d in deltas if d["type"] != "text_delta"] == ["signature_delta"]
    assert RAW not in str(checked.payloads)


def test_stop_sequences_end_the_answer(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>one two STOP three<|return|>")
    message = create(client, messages=HI, stop_sequences=["NEVER", "STOP"])
    assert message["content"] == [{"type": "text", "text": "one two "}]
    assert message["stop_reason"] == "stop_sequence"
    assert message["stop_sequence"] == "STOP"


def test_max_tokens_is_a_max_tokens_stop(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>one two three four five six seven<|return|>")
    checked = stream(client, messages=HI, max_tokens=6)
    (delta,) = [p for p in checked.payloads if p["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 6


def test_sampling_options_reach_the_engine(client: TestClient) -> None:
    from server.api.messages.adapter import generation_options, to_transcript
    from server.api.messages.schemas import MessagesRequest

    request = MessagesRequest.model_validate(
        {
            "model": MODEL,
            "max_tokens": 7,
            "messages": HI,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
        }
    )
    state = client.app.state  # type: ignore[attr-defined]
    transcript = to_transcript(request, "medium", "2026-01-02", state.messages.signer)
    prepared = state.generator.prepare(transcript, generation_options(request))
    params = prepared.params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (7, 0.5, 0.9, 40)
    default = state.generator.prepare(
        transcript, generation_options(request.model_copy(update={"top_k": None}))
    )
    assert default.params.top_k == 0  # the server's default


def test_tool_choice_names_an_unknown_tool(client: TestClient, forced: ForcedScript) -> None:
    before = len(forced.prompts)
    response = client.post(
        "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 10,
            "messages": HI,
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "nope"},
        },
    )
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert "tool_choice" in error["error"]["message"]
    assert len(forced.prompts) == before


def test_tool_error_results_are_marked(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(WEATHER_CALL)
    first = create(client, messages=HI, tools=[TOOL], thinking=THINKING)
    call = first["content"][-1]
    forced.push("<|channel|>final<|message|>Sorry.<|return|>")
    result = {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "is_error": True,
        "content": [{"type": "text", "text": "city unknown"}, {"type": "image", "source": {}}],
    }
    create(
        client,
        tools=[TOOL],
        messages=[
            *HI,
            {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [result]},
        ],
    )
    prompt = prompt_text(forced, encoding)
    assert "<|message|>Error: city unknown\n[image omitted]<|end|>" in prompt


@pytest.fixture(scope="module")
def summary_client(runtime: Runtime) -> Iterator[TestClient]:
    yield from app_client(runtime, reasoning_visibility="summary")


def test_summary_visibility_shows_the_summary_as_thinking(
    summary_client: TestClient, forced: ForcedScript
) -> None:
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    checked = stream(summary_client, messages=HI, thinking=THINKING)
    assert RAW not in str(checked.payloads)
    assert [b["type"] for b in checked.blocks()] == ["thinking", "text"]
    thinking = "".join(
        p["delta"].get("thinking", "")
        for p in checked.payloads
        if p["type"] == "content_block_delta"
    )
    assert thinking == SUMMARY_TEXT


@pytest.fixture(scope="module")
def hidden_client(runtime: Runtime) -> Iterator[TestClient]:
    yield from app_client(runtime, reasoning_visibility="none")


def test_none_visibility_shows_no_thinking(
    hidden_client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(WEATHER_CALL)
    message = create(hidden_client, messages=HI, tools=[TOOL], thinking=THINKING)
    assert [b["type"] for b in message["content"]] == ["tool_use"]
    forced.push("<|channel|>final<|message|>Sunny.<|return|>")
    call = message["content"][0]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}
    create(
        hidden_client,
        tools=[TOOL],
        messages=[
            *HI,
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ],
    )
    # the reasoning the client never saw is restored by the call's id
    assert "<|channel|>analysis<|message|>Need weather.<|end|>" in prompt_text(forced, encoding)


@pytest.fixture(scope="module")
def keyed_client(runtime: Runtime) -> Iterator[TestClient]:
    yield from app_client(runtime, api_key="sesame")


@pytest.mark.parametrize(
    "headers",
    [{"x-api-key": "sesame"}, {"authorization": "Bearer sesame"}],
    ids=["x-api-key", "bearer"],
)
def test_either_key_header_is_accepted(
    keyed_client: TestClient, forced: ForcedScript, headers: dict[str, str]
) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    body = {"model": MODEL, "max_tokens": 10, "messages": HI}
    headers = {**headers, "anthropic-version": "2023-06-01", "anthropic-beta": "x,y"}
    assert keyed_client.post("/v1/messages", json=body, headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}],
    ids=["none", "wrong", "wrong-bearer"],
)
def test_a_missing_key_is_an_anthropic_401(
    keyed_client: TestClient, headers: dict[str, str]
) -> None:
    response = keyed_client.post(
        "/v1/messages", json={"model": MODEL, "max_tokens": 10, "messages": HI}, headers=headers
    )
    assert response.status_code == 401
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "authentication_error"
    chat = keyed_client.post("/v1/chat/completions", json={"messages": HI}, headers=headers)
    assert chat.status_code == 401
    assert chat.json()["error"]["type"] == "authentication_error"  # OpenAI's envelope there


def test_the_server_seed_makes_a_messages_request_reproducible(runtime: Runtime) -> None:
    """Messages has no `seed`: under --seed the same request gives the same sampled tokens;
    without it (the control) the same request draws afresh."""
    body = {"messages": [{"role": "user", "content": "Draw."}], "temperature": 1.0,
            "max_tokens": 16, "thinking": THINKING}  # fmt: skip
    for seed, same in ((7, True), (None, False)):
        with TestClient(create_app(Settings(seed=seed), runtime)) as seeded:
            blocks = [create(seeded, **body)["content"] for _ in range(2)]
        texts = {"".join(b.get("thinking") or b.get("text") or "" for b in bs) for bs in blocks}
        assert "" not in texts
        assert (len(texts) == 1) is same, texts
