"""/v1/responses with include: ["message.output_text.logprobs"] on the real tiny engine: the
output_text part, its delta and done events carry OpenAI's logprob entries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.responses import MODEL, create, responses_client, stream
from tests.support.scripts import GREETING

ANSWER = "Hello! 👋 How can I help?"
INCLUDE = ["message.output_text.logprobs"]


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with responses_client(runtime, tmp_path_factory.mktemp("store")) as test_client:
        yield test_client


def joined_bytes(entries: list[dict[str, Any]]) -> str:
    return b"".join(bytes(entry["bytes"]) for entry in entries).decode()


def output_part(body: dict[str, Any]) -> dict[str, Any]:
    message = next(item for item in body["output"] if item["type"] == "message")
    part: dict[str, Any] = message["content"][0]
    return part


def test_output_text_carries_logprobs(client: TestClient, forced: ForcedScript) -> None:
    forced.push(GREETING)
    body = create(client, input="Hi", include=INCLUDE, top_logprobs=2, store=False)
    part = output_part(body)
    assert part["text"] == ANSWER
    assert joined_bytes(part["logprobs"]) == ANSWER
    for entry in part["logprobs"]:
        assert len(entry["top_logprobs"]) == 2
        assert entry["logprob"] <= entry["top_logprobs"][0]["logprob"] + 1e-9


def test_streamed_deltas_and_done_carry_logprobs(client: TestClient, forced: ForcedScript) -> None:
    forced.push(GREETING)
    checked = stream(client, input="Hi", include=INCLUDE, store=False)
    deltas = [e for e in checked.events if e["type"] == "response.output_text.delta"]
    streamed = [entry for delta in deltas for entry in delta["logprobs"]]
    assert joined_bytes(streamed) == ANSWER
    done = next(e for e in checked.events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == streamed
    part_done = next(
        e
        for e in checked.events
        if e["type"] == "response.content_part.done" and e["part"]["type"] == "output_text"
    )
    assert part_done["part"]["logprobs"] == streamed
    assert output_part(checked.terminal["response"])["logprobs"] == streamed
    assert all(entry["top_logprobs"] == [] for entry in streamed)


def test_no_logprobs_unless_included(client: TestClient, forced: ForcedScript) -> None:
    forced.push(GREETING)
    body = create(client, input="Hi", store=False)
    assert output_part(body)["logprobs"] == []


def test_too_many_top_logprobs_is_a_400(client: TestClient) -> None:
    response = client.post(
        "/v1/responses",
        json={"model": MODEL, "input": "Hi", "include": INCLUDE, "top_logprobs": 21},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "top_logprobs"
