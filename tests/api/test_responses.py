"""/v1/responses over in-process HTTP on the real tiny engine, outputs forced.

Every stream goes through the grammar checker (tests/support/event_grammar.py), which also
validates each event against the openai SDK's own types.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.responses import MODEL, create, responses_client, stream
from tests.support.scripts import GREETING, LIST_FILES_CALL

REASON_THEN_ANSWER = GREETING
EXEC_TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
EXEC_CALL = LIST_FILES_CALL


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with responses_client(runtime, tmp_path_factory.mktemp("store")) as test_client:
        yield test_client


def prompt_text(encoding: HarmonyEncoding, forced: ForcedScript) -> str:
    return encoding.decode_utf8(forced.prompts[-1])


def test_stream_reasoning_then_answer(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    script = forced.push(REASON_THEN_ANSWER)
    checked = stream(client, input="Hi")
    reasoning, message = checked.items
    assert reasoning["content"] == [
        {"type": "reasoning_text", "text": "User greets. Reply briefly."}
    ]
    assert reasoning["summary"] == []
    assert message["content"][0]["text"] == "Hello! 👋 How can I help?"
    response = checked.response
    assert response.status == "completed"
    assert response.model == MODEL
    assert response.usage is not None
    assert response.usage.input_tokens == len(forced.prompts[-1])
    assert response.usage.output_tokens == len(script)
    analysis = encoding.encode(
        "<|channel|>analysis<|message|>User greets. Reply briefly.<|end|>", allowed_special="all"
    )
    assert response.usage.output_tokens_details.reasoning_tokens == len(analysis)
    assert prompt_text(encoding, forced).endswith(
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    )


def test_non_stream_is_the_fold_of_the_stream(client: TestClient, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    streamed = stream(client, input="Hi").terminal["response"]
    forced.push(REASON_THEN_ANSWER)
    body = create(client, input="Hi")

    def shape(response: dict[str, Any]) -> Any:
        items = [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]
        usage = {**response["usage"], "input_tokens_details": None}  # the cache may differ
        return items, usage, response["status"]

    assert shape(body) == shape(streamed)


def test_function_call(client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding) -> None:
    forced.push(EXEC_CALL)
    checked = stream(client, input="List files", tools=[EXEC_TOOL], tool_choice="auto")
    reasoning, call = checked.items
    assert reasoning["type"] == "reasoning"
    assert call["type"] == "function_call"
    assert call["name"] == "exec_command"
    assert "namespace" not in call
    assert call["arguments"] == '{"cmd":"ls"}'
    assert call["call_id"].startswith("call_")
    assert checked.types()[-1] == "response.completed"
    prompt = prompt_text(encoding, forced)
    assert "namespace functions {\n\n// Runs a command.\ntype exec_command" in prompt


def test_namespace_and_custom_tool_calls(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    tools = [
        {"type": "custom", "name": "apply_patch", "description": "Edit files."},
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Sub-agents.",
            "tools": [
                {"type": "function", "name": "close_agent", "parameters": {"type": "object"}}
            ],
        },
        {"type": "web_search", "external_web_access": False},
    ]
    forced.push(
        "<|channel|>commentary to=multi_agent_v1.close_agent <|constrain|>json"
        '<|message|>{"target":"a1"}<|call|>'
    )
    (call,) = stream(client, input="Close it", tools=tools).items
    assert (call["type"], call["name"], call["namespace"]) == (
        "function_call",
        "close_agent",
        "multi_agent_v1",
    )
    prompt = prompt_text(encoding, forced)
    assert "## multi_agent_v1\n\n// Sub-agents.\nnamespace multi_agent_v1 {" in prompt
    assert "type apply_patch = (_: {" in prompt
    assert "web_search" not in prompt
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    forced.push(f"<|channel|>commentary to=functions.apply_patch<|message|>{patch}<|call|>")
    (custom,) = stream(client, input="Patch it", tools=tools).items
    assert custom["type"] == "custom_tool_call"
    assert custom["name"] == "apply_patch"
    assert custom["input"] == patch  # raw text (not JSON) passes through


def test_tool_round_trip_extends_the_prompt_with_the_exact_tokens(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    question = f"List files {uuid.uuid4().hex}"
    output = forced.push(EXEC_CALL)
    first = create(client, input=question, tools=[EXEC_TOOL], store=False)
    first_prompt = forced.prompts[-1]
    replayed = [{**item, "status": "completed"} for item in first["output"]]
    call_id = first["output"][1]["call_id"]
    forced.push("<|channel|>final<|message|>Two files.<|return|>")
    second = create(
        client,
        input=[
            {"role": "user", "content": question},
            *replayed,
            {"type": "function_call_output", "call_id": call_id, "output": "a\nb"},
        ],
        tools=[EXEC_TOOL],
        store=False,
    )
    second_prompt = forced.prompts[-1]
    assert second_prompt[: len(first_prompt) + len(output)] == first_prompt + output
    assert encoding.decode_utf8(second_prompt[len(first_prompt) + len(output) :]) == (
        "<|start|>functions.exec_command to=assistant<|channel|>commentary<|message|>a\nb<|end|>"
        "<|start|>assistant"
    )
    assert (
        second["usage"]["input_tokens_details"]["cached_tokens"]
        >= len(first_prompt) + len(output) - 1
    )
    assert second["output"][0]["content"][0]["text"] == "Two files."


def test_reasoning_is_restored_when_the_client_drops_it(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    question = f"List files {uuid.uuid4().hex}"
    forced.push(EXEC_CALL)
    first = create(client, input=question, tools=[EXEC_TOOL], store=False)
    call = first["output"][1]
    forced.push("<|channel|>final<|message|>ok<|return|>")
    create(
        client,
        input=[
            {"role": "user", "content": question},
            call,  # no reasoning item
            {"type": "function_call_output", "call_id": call["call_id"], "output": "x"},
        ],
        tools=[EXEC_TOOL],
        store=False,
    )
    assert "<|channel|>analysis<|message|>Need to list files.<|end|>" in prompt_text(
        encoding, forced
    )


def test_history_merges_instructions_and_drops_finished_reasoning(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push("<|channel|>final<|message|>Bye!<|return|>")
    create(
        client,
        instructions="Be terse.",
        input=[
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "Hi"},
            {
                "type": "reasoning",
                "id": "rs_old",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "OLD-THOUGHT"}],
                "encrypted_content": None,
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
            {"type": "item_reference", "id": "msg_x"},  # unknown here: skipped
            {"role": "user", "content": "Bye", "id": "msg_2"},
        ],
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        client_metadata={"thread_id": "t"},
        prompt_cache_key="thread-1",
    )
    prompt = prompt_text(encoding, forced)
    assert "# Instructions\n\nBe terse.\n\nAnswer in English." in prompt
    assert "Reasoning: low" in prompt
    assert "OLD-THOUGHT" not in prompt
    assert "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>" in prompt
    assert prompt.endswith("<|start|>user<|message|>Bye<|end|><|start|>assistant")


def test_max_output_tokens_makes_the_response_incomplete(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push("<|channel|>final<|message|>one two three four five six seven<|return|>")
    checked = stream(client, input="Count", max_output_tokens=5)
    assert checked.types()[-1] == "response.incomplete"
    assert checked.items[-1]["status"] == "incomplete"
    forced.push("<|channel|>final<|message|>one two three four five six seven<|return|>")
    body = create(client, input="Count", max_output_tokens=5)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 5


def test_malformed_model_output_is_not_an_error(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>Hi<|end|>stray text<|return|>")
    checked = stream(client, input="Hi", max_output_tokens=50)
    assert checked.types()[-1] == "response.completed"
    assert [item["content"][0]["text"] for item in checked.items] == ["Hi"]


def test_preamble_is_a_commentary_message(client: TestClient, forced: ForcedScript) -> None:
    forced.push(
        "<|channel|>commentary<|message|>Checking.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done.<|return|>"
    )
    preamble, answer = stream(client, input="Go").items
    assert (preamble["phase"], answer["phase"]) == ("commentary", "final_answer")
    assert preamble["content"][0]["text"] == "Checking."


def test_response_echoes_the_request(client: TestClient, forced: ForcedScript) -> None:
    forced.push('<|channel|>final<|message|>{"answer":"x"}<|return|>')
    text_format = {
        "type": "json_schema",
        "name": "out",
        "schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
        "strict": True,
    }
    body = create(
        client,
        input="Answer",
        text={"format": text_format},
        metadata={"k": "v"},
        temperature=0.3,
        parallel_tool_calls=False,
        store=False,
    )
    assert body["text"] == {"format": text_format}
    assert body["metadata"] == {"k": "v"}
    assert body["temperature"] == 0.3
    assert body["parallel_tool_calls"] is False
    assert body["store"] is False
    assert body["object"] == "response"
    assert body["created_at"] <= body["completed_at"]


def test_keepalive_events_while_the_prompt_is_evaluated(
    runtime: Runtime, forced: ForcedScript, tmp_path: Path
) -> None:
    long_input = " ".join(uuid.uuid4().hex for _ in range(150))  # ≈3k new tokens
    with responses_client(runtime, tmp_path, responses_keepalive_s=0.0005) as client:
        forced.push("<|channel|>final<|message|>ok<|return|>")
        checked = stream(client, input=long_input)
    assert checked.keepalives >= 1
    assert checked.types()[-1] == "response.completed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 5}, "temperature"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0]"),
        (
            {"input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]},
            "input[0].call_id",
        ),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        (
            {
                "input": "x",
                "tools": [EXEC_TOOL],
                "tool_choice": {"type": "function", "name": "nope"},
            },
            "tool_choice",
        ),
        ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
    ],
)
def test_bad_requests_get_openai_errors(
    client: TestClient, forced: ForcedScript, body: dict[str, Any], param: str
) -> None:
    before = len(forced.prompts)
    response = client.post("/v1/responses", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    assert len(forced.prompts) == before  # refused before anything ran


def test_prompt_longer_than_context_is_a_400_before_compute(
    client: TestClient, forced: ForcedScript
) -> None:
    before = len(forced.prompts)
    response = client.post("/v1/responses", json={"input": "word " * 5000, "stream": True})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "input"
    assert len(forced.prompts) == before


def test_an_api_key_guards_every_responses_route(
    runtime: Runtime, forced: ForcedScript, tmp_path: Path
) -> None:
    with responses_client(runtime, tmp_path, api_key="sk-local") as client:
        for method, path in (("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x")):
            refused = client.request(method, path, json={"input": "Hi"})
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "authentication_error"
        forced.push("<|channel|>final<|message|>ok<|return|>")
        allowed = client.post(
            "/v1/responses", json={"input": "Hi"}, headers={"Authorization": "Bearer sk-local"}
        )
        assert allowed.status_code == 200
