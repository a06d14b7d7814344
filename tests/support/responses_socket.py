"""The Responses WebSocket (/v1/responses) as the tests see it: from the client's side, the
socket URL of a served app, a create sent, its events read to the end (an error event ends a
create too) and checked by the same grammar as a streamed POST; from the server's side, which
connections a client (Codex) made and what went over its sockets."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.sync.client import ClientConnection

from tests.support.event_grammar import TERMINALS, CheckedStream, check_stream
from tests.support.responses import MODEL

TIMEOUT_S = 120.0  # a response on the tiny engine takes well under a second; a hang fails


def socket_url(base_url: str) -> str:
    """ws://HOST:PORT/v1/responses of an app's /v1 base URL (http://HOST:PORT/v1)."""
    return base_url.replace("http://", "ws://", 1) + "/responses"


def send_create(ws: ClientConnection, **body: Any) -> None:
    ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))


def receive_until_end(ws: ClientConnection) -> list[dict[str, Any]]:
    """The events of one create, up to its terminal event or its error event."""
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(ws.recv(timeout=TIMEOUT_S))
        events.append(event)
        if event["type"] in TERMINALS or event["type"] == "error":
            return events


def create(ws: ClientConnection, **body: Any) -> CheckedStream:
    """A create whose events must be a whole response passing the stream grammar."""
    send_create(ws, **body)
    events = receive_until_end(ws)
    assert events[-1]["type"] != "error", events[-1]
    return check_stream(events)


def refused(ws: ClientConnection, **body: Any) -> dict[str, Any]:
    """A create that must be refused: its one error event."""
    send_create(ws, **body)
    (event,) = receive_until_end(ws)
    assert event["type"] == "error", event
    return event


@dataclass
class Connection:
    """One connection an app received: HTTP or WebSocket, and on a socket what went each way."""

    kind: str  # "http" | "websocket"
    method: str
    path: str
    at: float = field(default_factory=time.monotonic)  # when it arrived
    status: int | None = None  # the HTTP answer's status (101: a socket's handshake accepted)
    accepted: bool = False  # a socket's handshake answered 101
    ended: bool = False  # the app is done with the connection (a socket's handler returned)
    received: list[dict[str, Any]] = field(default_factory=list)  # the client's messages
    received_at: list[float] = field(default_factory=list)  # when each came (time.monotonic)
    sent: list[dict[str, Any]] = field(default_factory=list)  # the server's events


class TransportRecorder:
    """ASGI middleware recording every connection (how each client reached the app), and on
    WebSockets every JSON text message in both directions."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.connections: list[Connection] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        connection = Connection(scope["type"], scope.get("method", "GET"), scope["path"])
        self.connections.append(connection)
        if scope["type"] == "http":

            async def status_send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    connection.status = message["status"]
                await send(message)

            await self.app(scope, receive, status_send)
            return

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive" and message.get("text"):
                connection.received.append(json.loads(message["text"]))
                connection.received_at.append(time.monotonic())
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "websocket.accept":
                connection.accepted = True
                connection.status = 101
            elif message["type"] == "websocket.http.response.start":  # a refused handshake
                connection.status = message["status"]
            elif message["type"] == "websocket.send" and message.get("text"):
                connection.sent.append(json.loads(message["text"]))
            await send(message)

        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            connection.ended = True

    def sockets(self) -> list[Connection]:
        return [c for c in self.connections if c.kind == "websocket" and c.accepted]

    def posts(self, path: str) -> list[Connection]:
        return [c for c in self.connections if (c.kind, c.method, c.path) == ("http", "POST", path)]


def responses_of(connection: Connection) -> list[list[dict[str, Any]]]:
    """The events a socket sent, split into its responses (each ends with a terminal event or
    an error event)."""
    responses: list[list[dict[str, Any]]] = [[]]
    for event in connection.sent:
        responses[-1].append(event)
        if event["type"] in TERMINALS or event["type"] == "error":
            responses.append([])
    return [events for events in responses if events]
