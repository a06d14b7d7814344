"""Helpers for /v1/messages tests: checked Anthropic streams and a recorder of exchanges.

`check_messages_sse` validates every streamed event against the anthropic SDK's own types
(`RawMessageStreamEvent`, `ErrorResponse`) and the stream grammar: `message_start` first, blocks
strictly one after the other with indexes 0, 1, 2, ... (start, deltas of its own kind, stop),
`message_delta` then `message_stop` last, or an `error` event last; `ping` anywhere after
`message_start`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from anthropic.types import RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.support.sse import parse_sse

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
DELTA_KINDS = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
}


@dataclass
class CheckedMessageStream:
    """A stream that passed the checks: its payloads, in order."""

    payloads: list[dict[str, Any]]

    def types(self) -> list[str]:
        return [p["type"] for p in self.payloads]

    def blocks(self) -> list[dict[str, Any]]:
        """The content blocks as `content_block_start` opened them."""
        return [p["content_block"] for p in self.payloads if p["type"] == "content_block_start"]


def check_messages_sse(lines: Iterable[str]) -> CheckedMessageStream:
    """Parse an Anthropic SSE body; every check failing raises AssertionError."""
    payloads: list[dict[str, Any]] = []
    for event in parse_sse(lines):
        data = event.json()
        assert event.event == data["type"], (event.event, data["type"])
        payloads.append(data)
    _check_grammar(payloads)
    return CheckedMessageStream(payloads)


def _check_grammar(payloads: list[dict[str, Any]]) -> None:
    assert payloads, "an empty stream"
    assert payloads[0]["type"] == "message_start", payloads[0]
    open_block: tuple[int, str] | None = None
    next_index = 0
    for position, payload in enumerate(payloads):
        kind = payload["type"]
        if kind == "ping":
            assert payload == {"type": "ping"}
            continue
        if kind == "error":
            ErrorResponse.model_validate(payload)
            assert position == len(payloads) - 1, "an error event must be the last one"
            return
        STREAM_EVENT.validate_python(payload)
        if kind == "content_block_start":
            assert open_block is None, f"block {next_index} opened inside another"
            assert payload["index"] == next_index
            open_block = (next_index, payload["content_block"]["type"])
            next_index += 1
        elif kind == "content_block_delta":
            assert open_block is not None
            assert payload["index"] == open_block[0]
            assert payload["delta"]["type"] in DELTA_KINDS[open_block[1]], payload
        elif kind == "content_block_stop":
            assert open_block is not None
            assert payload["index"] == open_block[0]
            open_block = None
        elif kind == "message_delta":
            assert open_block is None, "message_delta inside a block"
            assert payloads[position + 1 :]
            assert payloads[-1]["type"] == "message_stop"
        elif kind == "message_start":
            assert position == 0
    assert payloads[-1]["type"] == "message_stop", payloads[-1]
    assert [p["type"] for p in payloads].count("message_delta") == 1


@dataclass
class Exchange:
    """One HTTP request the server received and what it answered."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    content_type: str = ""
    response: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class ExchangeRecorder:
    """ASGI middleware keeping every request (headers, body) and its response body."""

    app: ASGIApp
    exchanges: list[Exchange] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        exchange = Exchange(scope["method"], scope["path"], query, headers, b"")
        self.exchanges.append(exchange)
        chunks: list[bytes] = []

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body += message.get("body", b"")
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                exchange.content_type = content_type.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    exchange.response = b"".join(chunks)
            await send(message)

        await self.app(scope, recording_receive, recording_send)
