"""Bad and hostile /v1/messages requests get a clear 4xx in Anthropic's error envelope, before
any compute, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types.shared import ErrorResponse
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings

MODEL = "gpt-oss-tiny"
LIMIT = 64 * 1024
HI = [{"role": "user", "content": "Hi"}]
TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {}}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
PATHS = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(max_request_bytes=LIMIT), runtime)) as test_client:
        yield test_client


def assert_error(response: Any, status: int, error_type: str = "invalid_request_error") -> str:
    """The response is Anthropic's error envelope, exactly; returns the message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"}
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == error_type
    assert body["error"]["message"]
    if error_type != "request_too_large":  # Anthropic's 413 type, not in the SDK's union
        ErrorResponse.model_validate(body)
    message: str = body["error"]["message"]
    return message


def assert_still_serving(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>Still here.<|return|>")
    response = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 20, "messages": HI})
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "Still here."}]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"messages": [', b"", b"\xff\xfe{}", b"[1, 2]", b'"text"', b"null", b"42"],
    ids=["broken", "truncated", "empty", "not-utf8", "array", "string", "null", "number"],
)
def test_malformed_json_is_a_400(
    client: TestClient, forced: ForcedScript, path: str, raw: bytes
) -> None:
    before = len(forced.prompts)
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert_error(response, 400)
    assert len(forced.prompts) == before


def user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def with_call(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *HI,
        {"role": "assistant", "content": [CALL]},
        {"role": "user", "content": list(blocks)},
    ]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
BAD_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("no-max-tokens", {"messages": HI}, "max_tokens"),
    ("zero-max-tokens", {"messages": HI, "max_tokens": 0}, "max_tokens"),
    ("no-messages", {"max_tokens": 5}, "messages"),
    ("empty-messages", {"max_tokens": 5, "messages": []}, "messages"),
    ("bad-role", {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "role"),
    ("content-number", {"max_tokens": 5, "messages": [{"role": "user", "content": 5}]}, "content"),
    ("unknown-block", {"max_tokens": 5, "messages": user({"type": "bogus"})}, "'bogus'"),
    ("block-no-type", {"max_tokens": 5, "messages": user({"text": "x"})}, "None"),
    ("image", {"max_tokens": 5, "messages": user(IMAGE)}, "gpt-oss reads text only"),
    (
        "document",
        {"max_tokens": 5, "messages": user({"type": "document", "source": {}})},
        "gpt-oss reads text only",
    ),
    ("tool-use-from-user", {"max_tokens": 5, "messages": user(CALL)}, "user messages cannot"),
    (
        "thinking-from-user",
        {"max_tokens": 5, "messages": user({"type": "thinking", "thinking": "x"})},
        "user messages cannot",
    ),
    (
        "result-from-assistant",
        {
            "max_tokens": 5,
            "messages": [{"role": "assistant", "content": [{"type": "tool_result"}]}],
        },
        "assistant messages cannot",
    ),
    ("text-without-text", {"max_tokens": 5, "messages": user({"type": "text"})}, "text"),
    (
        "unknown-tool-result",
        {"max_tokens": 5, "messages": user({"type": "tool_result", "tool_use_id": "toolu_x"})},
        "matches no earlier tool_use",
    ),
    (
        "result-without-id",
        {"max_tokens": 5, "messages": with_call({"type": "tool_result"})},
        "tool_use_id",
    ),
    (
        "tool-use-without-name",
        {
            "max_tokens": 5,
            "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}],
        },
        "name",
    ),
    (
        "tool-without-name",
        {"max_tokens": 5, "messages": HI, "tools": [{"input_schema": {}}]},
        "name",
    ),
    ("tools-not-a-list", {"max_tokens": 5, "messages": HI, "tools": {"a": 1}}, "tools"),
    (
        "tool-choice-bogus",
        {"max_tokens": 5, "messages": HI, "tools": [TOOL], "tool_choice": {"type": "bogus"}},
        "tool_choice",
    ),
    (
        "tool-choice-any-no-tools",
        {"max_tokens": 5, "messages": HI, "tool_choice": {"type": "any"}},
        "tool_choice",
    ),
    (
        "thinking-bogus",
        {"max_tokens": 5, "messages": HI, "thinking": {"type": "bogus"}},
        "thinking",
    ),
    (
        "effort-bogus",
        {"max_tokens": 5, "messages": HI, "output_config": {"effort": "huge"}},
        "effort",
    ),
    ("temperature", {"max_tokens": 5, "messages": HI, "temperature": 5}, "temperature"),
    ("top-k", {"max_tokens": 5, "messages": HI, "top_k": -1}, "top_k"),
    ("stop-not-list", {"max_tokens": 5, "messages": HI, "stop_sequences": 7}, "stop_sequences"),
    ("system-image", {"max_tokens": 5, "messages": HI, "system": [IMAGE]}, "system"),
]


@pytest.mark.parametrize(
    ("body", "mentions"), [(b, m) for _, b, m in BAD_BODIES], ids=[i for i, _, _ in BAD_BODIES]
)
def test_bad_requests_are_a_400_naming_the_problem(
    client: TestClient, forced: ForcedScript, body: dict[str, Any], mentions: str
) -> None:
    before = len(forced.prompts)
    message = assert_error(client.post("/v1/messages", json={"model": MODEL, **body}), 400)
    assert mentions in message, message
    assert len(forced.prompts) == before


def test_count_tokens_refuses_bad_input_the_same_way(client: TestClient) -> None:
    body = {"model": MODEL, "messages": user(IMAGE)}
    message = assert_error(client.post("/v1/messages/count_tokens", json=body), 400)
    assert "gpt-oss reads text only" in message
    ok = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": HI})
    assert ok.status_code == 200
    assert ok.json()["input_tokens"] > 0


@pytest.mark.parametrize("path", PATHS)
def test_oversized_bodies_are_a_413(client: TestClient, forced: ForcedScript, path: str) -> None:
    big = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x" * LIMIT}]}
    assert_error(client.post(path, json=big), 413, "request_too_large")
    assert_still_serving(client, forced)


def test_a_prompt_longer_than_the_context_is_a_400(
    client: TestClient, forced: ForcedScript
) -> None:
    long = " ".join(["word"] * 5000)  # more tokens than the test context, under the byte limit
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": long}]}
    message = assert_error(client.post("/v1/messages", json=body), 400)
    assert message.startswith("prompt is too long: ")  # Anthropic's words


def test_unknown_paths_and_methods_answer_in_anthropic_shape(client: TestClient) -> None:
    assert_error(client.get("/v1/messages/nope"), 404, "not_found_error")
    assert_error(client.get("/v1/messages"), 405)


def test_the_server_keeps_serving_after_a_barrage(client: TestClient, forced: ForcedScript) -> None:
    for path in PATHS:
        for raw in (b"{", b"[]", b'{"messages": 1, "max_tokens": {}}', b'{"model": null}'):
            response = client.post(path, content=raw, headers={"content-type": "application/json"})
            assert 400 <= response.status_code < 500
    assert client.get("/health").status_code == 200
    assert_still_serving(client, forced)


@pytest.mark.parametrize("path", PATHS)
def test_a_lone_surrogate_is_a_400_not_a_500(
    client: TestClient, forced: ForcedScript, path: str
) -> None:
    """Regression: harmony's render raised on a str with a lone surrogate (a 500)."""
    raw = b'{"model": "%s", "max_tokens": 8, "messages": [{"role": "user", "content": "\\udc00"}]}'
    before = len(forced.prompts)
    response = client.post(
        path, content=raw % MODEL.encode(), headers={"content-type": "application/json"}
    )
    assert "lone UTF-16 surrogate" in assert_error(response, 400)
    assert len(forced.prompts) == before
    assert_still_serving(client, forced)
