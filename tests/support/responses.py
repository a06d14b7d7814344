"""Helpers for /v1/responses tests: an app with its own store, and checked streams."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from openai.types.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from devkit.serving import served as devkit_served
from server.api.responses.adapter import generation_options, to_conversation, to_transcript
from server.api.responses.schemas import ResponsesRequest
from server.app import create_app
from server.contracts.transcript import Item, Transcript
from server.core.generation import GenerationOptions
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.event_grammar import CheckedStream, check_stream
from tests.support.sse import parse_sse

MODEL = "gpt-oss-tiny"


@contextmanager
def responses_client(runtime: Runtime, store_dir: Path, **settings: Any) -> Iterator[TestClient]:
    """A TestClient on an app whose response store lives in `store_dir`."""
    config = Settings(responses_store_path=store_dir / "responses.sqlite3", **settings)
    with TestClient(create_app(config, runtime)) as client:
        yield client


class StreamRecorder:
    """ASGI middleware keeping the body of every text/event-stream response it passes on, and
    the body of every POST request (as received, still encoded if the client compressed it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.streams: list[bytes] = []
        self.requests: list[tuple[str, dict[bytes, bytes], bytes]] = []  # path, headers, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        is_stream = False
        if scope["method"] == "POST":
            receive = self._recording_receive(scope, receive)

        async def recording_send(message: Message) -> None:
            nonlocal is_stream
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                is_stream = content_type.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and is_stream:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.streams.append(b"".join(chunks))
            await send(message)

        await self.app(scope, receive, recording_send)

    def _recording_receive(self, scope: Scope, receive: Receive) -> Receive:
        parts: list[bytes] = []

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    headers = dict(scope.get("headers", []))
                    self.requests.append((scope["path"], headers, b"".join(parts)))
            return message

        return recording_receive


@contextmanager
def served(app: ASGIApp) -> Iterator[str]:
    """`app` served by uvicorn on 127.0.0.1 in a thread; yields its /v1 base URL."""
    with devkit_served(app) as root:
        yield f"{root}/v1"


def sse_payloads(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The `data:` payloads of a Responses stream; each `event:` name must match its type."""
    payloads = []
    for event in parse_sse(lines):
        data = event.json()
        assert event.event == data["type"], (event.event, data["type"])
        payloads.append(data)
    return payloads


def check_sse(raw: bytes) -> CheckedStream:
    """A raw Responses SSE body through the grammar checker."""
    return check_stream(sse_payloads(iter(raw.decode().splitlines())))


def stream(client: TestClient, **body: Any) -> CheckedStream:
    """POST a streaming request; the stream must pass the grammar checker."""
    with client.stream(
        "POST", "/v1/responses", json={"model": MODEL, "stream": True, **body}
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return check_stream(sse_payloads(response.iter_lines()))


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    """POST a non-streaming request; the body must be a valid SDK Response."""
    response = client.post("/v1/responses", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    Response.model_validate(data)
    return data


@dataclass(frozen=True)
class Translated:
    """A Responses request in the core's terms, as the router builds it."""

    conversation: tuple[Item, ...]
    transcript: Transcript
    options: GenerationOptions


def translate(
    body: dict[str, Any], earlier: Sequence[Item] = (), date: str = "2026-01-02"
) -> Translated:
    """The adapter's steps over a request body, in the router's order."""
    request = ResponsesRequest.model_validate(body)
    conversation = to_conversation(request, earlier)
    transcript = to_transcript(request, conversation, "medium", date)
    return Translated(conversation, transcript, generation_options(request))
