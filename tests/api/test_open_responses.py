"""/v1/responses against the Open Responses specification (2026-04-24).

Every body, streamed event and output item the specification defines is validated against the
project's conformance schema of the specification's requirements, and also against the
specification's published OpenAPI document when GPT_OSS_OPEN_RESPONSES_SPEC names a copy
(tests/support/open_responses.py), over the requests a client makes: text, reasoning, function
calls, tool results, an incomplete response, a failed one; the reasoning events under both names
(--responses-reasoning-events); compaction (/v1/responses/compact) and token counting
(/v1/responses/input_tokens). Outputs are forced.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.api.responses.emitter import ResponsesEmitter
from server.api.responses.schemas import ResponseObject
from server.contracts.events import Finished, FinishReason, Usage
from server.ops.runtime import Runtime
from tests.support import open_responses as spec
from tests.support.event_grammar import check_stream
from tests.support.responses import MODEL, create, responses_client, sse_payloads
from tests.support.scripts import GREETING, answer, call, reason_then_call

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
BARE_TOOL = {"type": "function", "name": "get_time"}  # no description, parameters, strict


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with responses_client(runtime, tmp_path_factory.mktemp("store")) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def spec_client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server that names the reasoning events as the specification does."""
    store = tmp_path_factory.mktemp("spec-store")
    with responses_client(
        runtime, store, responses_reasoning_events="open-responses"
    ) as test_client:
        yield test_client


def raw_stream(client: TestClient, **body: Any) -> list[dict[str, Any]]:
    with client.stream(
        "POST", "/v1/responses", json={"model": MODEL, "stream": True, **body}
    ) as response:
        assert response.status_code == 200, response.read()
        return sse_payloads(response.iter_lines())


def check_response(body: dict[str, Any]) -> None:
    """A response object, and each of its output items as the item union it belongs to."""
    spec.check("response", body)
    for item in body["output"]:
        spec.check("output_item", item)


def check_streamed(events: list[dict[str, Any]]) -> None:
    """Each event the specification defines, and the response every lifecycle event carries;
    with OpenAI's names (the default) the raw reasoning's events are the only others."""
    foreign = spec.check_events(events)
    assert set(foreign) <= {"response.reasoning_text.delta", "response.reasoning_text.done"}
    for event in events:
        if "response" in event:
            check_response(event["response"])
        if "item" in event:
            spec.check("output_item", event["item"])


@pytest.mark.parametrize(
    ("script", "body"),
    [
        (answer("Plain text."), {"input": "Say something"}),
        (GREETING, {"input": "Hi", "reasoning": {"effort": "low"}}),
        (
            reason_then_call("Need weather.", "get_weather", '{"city":"Paris"}'),
            {"input": "Weather?", "tools": [WEATHER_TOOL, BARE_TOOL]},
        ),
        (
            answer("It is sunny."),
            {
                "input": [
                    {"type": "message", "role": "user", "content": "Weather in Paris?"},
                    {
                        "type": "function_call",
                        "call_id": "call_1",
                        "name": "get_weather",
                        "arguments": '{"city":"Paris"}',
                    },
                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                ],
                "tools": [WEATHER_TOOL],
                "instructions": "Be brief.",
                "metadata": {"k": "v"},
                "temperature": 0.7,
                "top_p": 0.9,
                "safety_identifier": "user-1",
                "max_tool_calls": 3,
            },
        ),
        (
            "<|channel|>final<|message|>one two three four five six seven<|return|>",
            {"input": "Count", "max_output_tokens": 4},
        ),
    ],
    ids=["text", "reasoning", "function-call", "tool-result", "incomplete"],
)
def test_bodies_and_streams_conform(
    client: TestClient, forced: ForcedScript, script: str, body: dict[str, Any]
) -> None:
    forced.push(script)
    check_response(create(client, **body))
    forced.push(script)
    events = raw_stream(client, **body)
    check_stream(events)
    check_streamed(events)
    terminal = events[-1]["type"]
    assert terminal == (
        "response.incomplete" if "max_output_tokens" in body else "response.completed"
    )


def test_the_echoed_fields_say_what_was_used(client: TestClient, forced: ForcedScript) -> None:
    forced.push(call("get_time", "{}"))
    body = create(
        client,
        input="Time?",
        tools=[BARE_TOOL],
        top_logprobs=2,
        max_tool_calls=2,
        safety_identifier="abc",
        presence_penalty=0.5,
        service_tier="priority",
    )
    assert body["tools"] == [
        {"type": "function", "name": "get_time", "description": None, "parameters": None}
        | {"strict": None}
    ]
    assert (body["top_logprobs"], body["max_tool_calls"], body["safety_identifier"]) == (
        2,
        2,
        "abc",
    )
    # no penalty is applied, one tier is served, nothing runs in the background
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.0, 0.0)
    assert (body["service_tier"], body["background"]) == ("default", False)


def test_reasoning_items_have_no_null_encrypted_content(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push(GREETING)
    events = raw_stream(client, input="Hi")
    reasoning = [e["item"] for e in events if e.get("item", {}).get("type") == "reasoning"]
    assert reasoning
    assert all("encrypted_content" not in item for item in reasoning)
    for item in reasoning:
        spec.check("reasoning_item", item)


def test_background_is_refused(client: TestClient) -> None:
    response = client.post("/v1/responses", json={"model": MODEL, "input": "x", "background": True})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "background"


def _without(key: str) -> Callable[[dict[str, Any]], object]:
    return lambda part: part.pop(key)


@pytest.mark.parametrize(
    ("where", "breaking", "said"),
    [
        (lambda body: body, _without("background"), "'background' is a required property"),
        (lambda body: body, _without("presence_penalty"), "'presence_penalty' is a required"),
        (lambda body: body["tools"][0], _without("strict"), "'strict' is a required property"),
        (
            lambda body: body["output"][0],
            lambda item: item.update(encrypted_content=None),
            "None is not of type 'string'",
        ),
        (lambda body: body, lambda body: body.update(top_logprobs=None), "None is not of type"),
    ],
    ids=["no-background", "no-presence-penalty", "no-strict", "null-encrypted", "null-logprobs"],
)
def test_the_conformance_check_refuses_what_the_specification_does(
    client: TestClient,
    forced: ForcedScript,
    where: Callable[[dict[str, Any]], dict[str, Any]],
    breaking: Callable[[dict[str, Any]], object],
    said: str,
) -> None:
    """The checks above can fail: a conforming body, broken as the server once was, is not."""
    forced.push(reason_then_call("Need weather.", "get_weather", '{"city":"Paris"}'))
    body = create(client, input="Weather?", tools=[WEATHER_TOOL], reasoning={"effort": "low"})
    assert body["output"][0]["type"] == "reasoning"
    assert not spec.problems("response", body)
    broken = copy.deepcopy(body)
    breaking(where(broken))
    found = spec.problems("response", broken)
    assert any(said in problem for problem in found), found


def test_a_failed_response_conforms() -> None:
    """The terminal a failed generation ends with (its events as the emitter makes them)."""
    emitter = ResponsesEmitter(ResponseObject(id="resp_1", created_at=1, model=MODEL))
    events = emitter.start()
    events += emitter.feed(Finished(FinishReason.ERROR, Usage(prompt_tokens=3), error="boom"))
    payloads = [event.model_dump(mode="json") for event in events]
    assert payloads[-1]["type"] == "response.failed"
    check_streamed(payloads)


# ------------------------------------------------------------------- the specification's names


def test_open_responses_names_for_reasoning_events(
    spec_client: TestClient, forced: ForcedScript
) -> None:
    forced.push(GREETING)
    events = raw_stream(spec_client, input="Hi")
    types = [event["type"] for event in events]
    assert "response.reasoning.delta" in types
    assert "response.reasoning.done" in types
    spec.check_events(events, all_spec=True)  # every event is one the specification defines
    for event in events:
        if "response" in event:
            check_response(event["response"])
    # the same stream as OpenAI names it, event for event
    renamed = [
        {**event, "type": event["type"].replace("response.reasoning.", "response.reasoning_text.")}
        for event in events
    ]
    checked = check_stream(renamed)
    assert checked.items[0]["content"][0]["text"] == "User greets. Reply briefly."


# ---------------------------------------------------------------------------------- compaction


def test_compaction_continues_the_conversation(
    client: TestClient, forced: ForcedScript, encoding: Any
) -> None:
    tag = uuid.uuid4().hex[:8]
    turns: list[dict[str, Any]] = []
    for n in range(3):
        forced.push(reason_then_call(f"Look {n}.", "get_weather", f'{{"city":"C{n}"}}'))
        first = create(client, input=[*turns, _user(f"Weather {n} {tag}?")], tools=[WEATHER_TOOL])
        call_item = first["output"][-1]
        output = {"type": "function_call_output", "call_id": call_item["call_id"], "output": "hot"}
        forced.push(answer(f"C{n} is hot."))
        second = create(
            client,
            input=[*turns, _user(f"Weather {n} {tag}?"), *first["output"], output],
            tools=[WEATHER_TOOL],
        )
        turns += [_user(f"Weather {n} {tag}?"), *first["output"], output, *second["output"]]
    summary = f"SUMMARY-{tag}: C0, C1 and C2 are hot."
    forced.push(answer(summary))
    response = client.post(
        "/v1/responses/compact",
        json={"model": MODEL, "input": turns, "tools": [WEATHER_TOOL], "instructions": "Brief."},
    )
    assert response.status_code == 200, response.text
    compacted = response.json()
    spec.check("compaction_resource", compacted)
    asked = encoding.decode_utf8(forced.prompts[-1])
    assert "Compact this conversation" in asked
    assert "C2 is hot." in asked  # the model saw the whole conversation
    output = compacted["output"]
    assert [item["type"] for item in output] == ["message"] * 3 + ["compaction"]
    assert [item["content"][0]["text"] for item in output[:3]] == [
        f"Weather {n} {tag}?" for n in range(3)
    ]
    assert compacted["usage"]["input_tokens"] == len(forced.prompts[-1])
    for item in output:
        spec.check("input_item", item)  # usable as input, as the specification says

    forced.push(answer("Yes, all hot."))
    after = create(client, input=[*output, _user("All hot?")], tools=[WEATHER_TOOL])
    assert after["output"][-1]["content"][0]["text"] == "Yes, all hot."
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert summary in prompt
    assert "C1 is hot." not in prompt  # the compacted turns are gone
    assert prompt.endswith("<|start|>user<|message|>All hot?<|end|><|start|>assistant")
    assert len(forced.prompts[-1]) < len(forced.prompts[-2])


def test_a_foreign_compaction_item_is_a_400(client: TestClient) -> None:
    foreign = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABpM0Yj-x"}
    response = client.post("/v1/responses", json={"model": MODEL, "input": [foreign, _user("Hi")]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input[0].encrypted_content"


def test_nothing_to_compact_is_a_400(client: TestClient) -> None:
    response = client.post("/v1/responses/compact", json={"model": MODEL, "input": []})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"


# ------------------------------------------------------------------------------- input tokens


@pytest.mark.parametrize(
    "body",
    [
        {"input": "Hello there"},
        {
            "input": [{"type": "message", "role": "user", "content": "Weather?"}],
            "instructions": "Answer in French.",
            "tools": [WEATHER_TOOL, BARE_TOOL],
            "reasoning": {"effort": "high"},
        },
        {
            "input": [
                {"type": "message", "role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "call_9",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_9", "output": "rain"},
            ],
            "tools": [WEATHER_TOOL],
        },
    ],
    ids=["text", "tools-and-instructions", "tool-result"],
)
def test_input_tokens_is_the_prompt_the_engine_gets(
    client: TestClient, forced: ForcedScript, body: dict[str, Any]
) -> None:
    counted = client.post("/v1/responses/input_tokens", json={"model": MODEL, **body})
    assert counted.status_code == 200, counted.text
    data = counted.json()
    assert data["object"] == "response.input_tokens"
    forced.push(answer("ok"))
    ran = create(client, store=False, **body)
    assert data["input_tokens"] == len(forced.prompts[-1]) == ran["usage"]["input_tokens"]


def test_input_tokens_follows_previous_response_id(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push(answer("First answer."))
    first = create(client, input=f"First {uuid.uuid4().hex}")
    body = {"input": "Second", "previous_response_id": first["id"]}
    counted = client.post("/v1/responses/input_tokens", json={"model": MODEL, **body})
    forced.push(answer("ok"))
    create(client, **body)
    assert counted.json()["input_tokens"] == len(forced.prompts[-1])


def test_input_tokens_errors_are_the_apis(client: TestClient) -> None:
    missing = client.post(
        "/v1/responses/input_tokens",
        json={"model": MODEL, "input": "x", "previous_response_id": "resp_nope"},
    )
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "previous_response_id"
    bad = client.post("/v1/responses/input_tokens", json={"model": MODEL, "input": [{"x": 1}]})
    assert bad.status_code == 400


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}
