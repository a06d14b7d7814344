"""store, previous_response_id, GET and DELETE /v1/responses/{id}, across a restart."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.types.responses import Response
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.responses import create, responses_client, stream

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
# The model puts `to=` after the channel; a re-rendered call would put it in the role position,
# so a prompt that contains these exact tokens proves they were replayed, not re-rendered.
CALL = (
    "<|channel|>analysis<|message|>STORED-THOUGHT<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
    '<|message|>{"cmd":"ls"}<|call|>'
)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def client(runtime: Runtime, store_dir: Path) -> Iterator[TestClient]:
    with responses_client(runtime, store_dir) as test_client:
        yield test_client


def first_turn(
    client: TestClient, forced: ForcedScript, **body: Any
) -> tuple[dict[str, Any], list[int], list[int]]:
    output = forced.push(CALL)
    response = create(
        client,
        input=[
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": f"List files {uuid.uuid4().hex}"},
        ],
        tools=TOOLS,
        **body,
    )
    return response, forced.prompts[-1], output


def continue_turn(
    client: TestClient, forced: ForcedScript, previous: dict[str, Any]
) -> dict[str, Any]:
    call_id = previous["output"][-1]["call_id"]
    forced.push("<|channel|>final<|message|>Two files.<|return|>")
    return create(
        client,
        previous_response_id=previous["id"],
        input=[{"type": "function_call_output", "call_id": call_id, "output": "a\nb"}],
        tools=TOOLS,
    )


def test_stored_response_can_be_retrieved_and_deleted(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push("<|channel|>final<|message|>Hi!<|return|>")
    checked = stream(client, input="Hi")  # store defaults to true, as on OpenAI
    response_id = checked.terminal["response"]["id"]
    got = client.get(f"/v1/responses/{response_id}")
    assert got.status_code == 200
    assert got.json() == checked.terminal["response"]
    Response.model_validate(got.json())
    deleted = client.delete(f"/v1/responses/{response_id}")
    assert deleted.json() == {"id": response_id, "object": "response", "deleted": True}
    for response in (
        client.get(f"/v1/responses/{response_id}"),
        client.delete(f"/v1/responses/{response_id}"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found_error"


def test_store_false_keeps_nothing(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>Hi!<|return|>")
    body = create(client, input="Hi", store=False)
    assert body["store"] is False
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404


def test_previous_response_id_continues_from_the_exact_tokens(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    first, first_prompt, output = first_turn(client, forced)
    second = continue_turn(client, forced, first)
    second_prompt = forced.prompts[-1]
    assert second_prompt[: len(first_prompt) + len(output)] == first_prompt + output
    assert encoding.decode_utf8(second_prompt[len(first_prompt) + len(output) :]) == (
        "<|start|>functions.exec_command to=assistant<|channel|>commentary<|message|>a\nb<|end|>"
        "<|start|>assistant"
    )
    assert second["previous_response_id"] == first["id"]
    assert (
        second["usage"]["input_tokens_details"]["cached_tokens"]
        >= len(first_prompt) + len(output) - 1
    )
    # a third turn chains on: the finished turn's reasoning is dropped, the rest stays
    forced.push("<|channel|>final<|message|>Bye.<|return|>")
    third = create(client, previous_response_id=second["id"], input="Thanks", tools=TOOLS)
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "STORED-THOUGHT" not in prompt
    assert "# Instructions\n\nBe terse." in prompt  # the first input's developer message
    assert "<|channel|>final<|message|>Two files.<|end|>" in prompt
    assert prompt.endswith("<|start|>user<|message|>Thanks<|end|><|start|>assistant")
    assert third["output"][0]["content"][0]["text"] == "Bye."


def test_a_restarted_server_continues_from_the_stored_tokens(
    runtime: Runtime, store_dir: Path, client: TestClient, forced: ForcedScript
) -> None:
    first, first_prompt, output = first_turn(client, forced)
    with responses_client(runtime, store_dir) as restarted:  # a new app: empty History
        continue_turn(restarted, forced, first)
    second_prompt = forced.prompts[-1]
    assert second_prompt[: len(first_prompt) + len(output)] == first_prompt + output


def test_unknown_previous_response_id_is_a_404(client: TestClient, forced: ForcedScript) -> None:
    before = len(forced.prompts)
    response = client.post(
        "/v1/responses", json={"previous_response_id": "resp_nope", "input": "Hi", "stream": True}
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "not_found_error"
    assert error["param"] == "previous_response_id"
    assert "resp_nope" in error["message"]
    assert len(forced.prompts) == before
