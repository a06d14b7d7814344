"""Chat Completions in tests: requests through the in-process client, the streamed chunks parsed
and checked against the openai SDK's types."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletionChunk

from tests.support.sse import parse_sse

USER_HI = [{"role": "user", "content": "Hi"}]


def post(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": "gpt-oss-tiny", **body})


def stream(client: TestClient, **body: Any) -> list[str]:
    with client.stream(
        "POST", "/v1/chat/completions", json={"model": "gpt-oss-tiny", "stream": True, **body}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [event.data for event in parse_sse(response.iter_lines())]


def chunks_of(datas: list[str]) -> list[ChatCompletionChunk]:
    assert datas[-1] == "[DONE]"
    return [ChatCompletionChunk.model_validate_json(d) for d in datas[:-1]]


def joined(chunks: list[ChatCompletionChunk], field: str) -> str:
    parts = []
    for chunk in chunks:
        for choice in chunk.choices:
            value = getattr(choice.delta, field, None)
            if value is None and choice.delta.model_extra:
                value = choice.delta.model_extra.get(field)
            parts.append(value or "")
    return "".join(parts)
