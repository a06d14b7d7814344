"""Bad and hostile requests get a clear 4xx in OpenAI's error envelope, before any compute, and
the server keeps serving. (Prompts longer than the context and tool outputs without their call
are tested beside each endpoint's other errors; schemathesis adds generated ones.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.responses import MODEL, responses_client

LIMIT = 64 * 1024
ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    store = tmp_path_factory.mktemp("store")
    with responses_client(runtime, store, max_request_bytes=LIMIT) as test_client:
        yield test_client


def assert_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == "invalid_request_error"
    return error


def assert_still_serving(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>Still here.<|return|>")
    response = client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Still here."


@pytest.mark.parametrize("path", ENDPOINTS)
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


# request bodies as their bytes: a JSON string whose `\\u` escapes spell lone surrogates
LONE_SURROGATES = {
    "/v1/chat/completions": b'{"model": "%s", "messages": [{"role": "user", "content": "a%sb"}]}',
    "/v1/responses": b'{"model": "%s", "input": "a%sb"}',
    "/v1/completions": b'{"model": "%s", "prompt": "a%sb", "max_tokens": 4}',
}


@pytest.mark.parametrize("path", sorted(LONE_SURROGATES))
@pytest.mark.parametrize(
    "escape", [b"\\ud800", b"\\uDC00", b"\\ud83d x"], ids=["high", "low", "unpaired"]
)
def test_a_lone_surrogate_is_a_400_not_a_500(
    client: TestClient, forced: ForcedScript, path: str, escape: bytes
) -> None:
    """Regression: harmony's render raised on a str with a lone surrogate (a 500)."""
    before = len(forced.prompts)
    raw = LONE_SURROGATES[path] % (MODEL.encode(), escape)
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    error = assert_error(response, 400)
    assert "lone UTF-16 surrogate" in error["message"]
    assert len(forced.prompts) == before
    assert_still_serving(client, forced)


def test_a_surrogate_pair_and_an_escaped_backslash_are_text(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    content = b"a \\ud83d\\ude00 and \\\\ud800 b"  # an emoji's pair, then the text \\ud800
    raw = LONE_SURROGATES["/v1/chat/completions"] % (MODEL.encode(), content)
    response = client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert "a \U0001f600 and \\ud800 b" in encoding.decode_utf8(forced.prompts[-1])


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": "Hi"}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": "ten"}, "max_tokens"),
        ("/v1/chat/completions", {"messages": USER, "tools": {"a": 1}}, "tools"),
        ("/v1/chat/completions", {"messages": USER, "stop": 7}, "stop"),
        ("/v1/responses", {"input": 5}, "input"),
        ("/v1/responses", {"input": [5]}, "input"),
        ("/v1/responses", {"input": "Hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": -3}, "max_output_tokens"),
        ("/v1/responses", {"input": "Hi", "metadata": ["x"]}, "metadata"),
    ],
)
def test_wrong_types_are_a_400_naming_the_field(
    client: TestClient, forced: ForcedScript, path: str, body: dict[str, Any], param: str
) -> None:
    before = len(forced.prompts)
    error = assert_error(client.post(path, json={"model": MODEL, **body}), 400)
    assert error["param"] is not None
    assert error["param"].startswith(param), error
    assert len(forced.prompts) == before


@pytest.mark.parametrize("path", ENDPOINTS)
def test_oversized_bodies_are_a_413(client: TestClient, forced: ForcedScript, path: str) -> None:
    big = {"model": MODEL, "messages": USER, "input": "x" * LIMIT}
    error = assert_error(client.post(path, json=big), 413)
    assert error["code"] == "request_too_large"
    assert_still_serving(client, forced)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "bogus", "content": "x"}, "unknown item type 'bogus'"),
        ({"type": ["message"], "role": "user", "content": "x"}, "unknown item type"),
        ({"content": "x"}, "neither a `type` nor a `role`"),
    ],
)
def test_unknown_item_types_are_a_400(
    client: TestClient, forced: ForcedScript, item: dict[str, Any], message: str
) -> None:
    before = len(forced.prompts)
    response = client.post("/v1/responses", json={"model": MODEL, "input": [item]})
    error = assert_error(response, 400)
    assert error["param"] == "input[0].type"
    assert error["code"] == "invalid_value"
    assert message in error["message"]
    assert len(forced.prompts) == before


def test_other_openai_item_types_are_skipped(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    items = [
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "item_reference", "id": "msg_0"},
        {"role": "user", "content": "Hi"},
    ]
    response = client.post("/v1/responses", json={"model": MODEL, "input": items})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64, 10**30])
@pytest.mark.parametrize("path", ENDPOINTS)
def test_any_integer_seed_is_served(
    client: TestClient, forced: ForcedScript, path: str, seed: int
) -> None:
    """Regression (found by schemathesis): a negative seed killed the engine thread."""
    forced.push("<|channel|>final<|message|>ok<|return|>")
    body = {"model": MODEL, "messages": USER, "input": "Hi", "seed": seed, "max_tokens": 8}
    assert client.post(path, json=body).status_code == 200
    assert_still_serving(client, forced)


def test_the_server_keeps_serving_after_a_barrage(client: TestClient, forced: ForcedScript) -> None:
    for path in ENDPOINTS:
        for raw in (b"{", b"[]", b'{"messages": 1, "input": {}}', b'{"model": null}'):
            response = client.post(path, content=raw, headers={"content-type": "application/json"})
            assert 400 <= response.status_code < 500
    assert client.get("/v1/responses/nope").status_code == 404
    assert client.delete("/v1/responses/nope").status_code == 404
    assert client.get("/health").status_code == 200
    assert_still_serving(client, forced)
