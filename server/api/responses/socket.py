"""The Responses API over a WebSocket on /v1/responses, as OpenAI's API and Codex CLI speak it.

The handshake is checked as a POST is: the Host and Origin checks run before any route
(host_check.py: a foreign name or page is refused there), then the API key (auth.py, in
constant time). A refusal is the HTTP answer to the handshake, in OpenAI's error envelope: 401
for the key; 426 when the socket is turned off (--no-websocket), the one answer on which Codex
falls back to HTTP at once for as long as it runs. The 101 answer announces the largest
message the server reads in `x-codex-websocket-max-message-bytes` (Codex reads it): the request
body limit (--max-request-bytes).

On the socket, the client sends `{"type": "response.create", ...the body of a POST...}` as a
JSON text message; the server answers with the events a streamed POST sends, each one JSON text
message, the terminal event (response.completed, .incomplete or .failed) last. `stream` is
implied. One response runs at a time: a create while one runs gets an error event and changes
nothing. `response.processed` (Codex acknowledges a response it handled) is read and ignored.
`generate: false` (Codex's warm-up of a new socket) completes at once with no output.

Continuing: the socket remembers its last response and the exact tokens it sampled, also with
`store: false`, so a create with `previous_response_id` naming it and only the new input items
continues the conversation, which the engine finds in the KV cache it left (the exact-token
replay of core/history.py); an id the socket does not hold is looked up in the store as on
HTTP. The socket pins the engine slot its conversation runs in for as long as it is open
(engine.base.SlotPin): other requests' prompts are not given that slot, so however many
conversations come between two turns, the next one finds its cache. The pin is released when
the socket ends, however it ends (a close, the client gone, the server shutting down); where
every slot is pinned, the pin used least recently yields (engine/slots.py).

Errors: a create refused before its first event (bad input, an unknown previous_response_id,
admission: the server busy) gets one error event, `{"type": "error", "status": 429, "error":
{...OpenAI's envelope...}, "headers": {"retry-after": "2"}}`, and the socket stays usable.
Codex maps an error event with a status to the very error an HTTP answer of that status gives
(429: retried after its backoff, reading retry-after from `headers`), whereas a close is a
broken stream to it (reconnect, and the turn's request sent again). A generation that fails
ends with response.failed as on SSE. A message over the limit gets an error event (413); a
binary message, one that is not JSON or of an unknown type, one each (400). Pings are answered
by the WebSocket layer (uvicorn); a close, or the client going away, stops the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from server.api.auth import carries_api_key
from server.api.error_handlers import describe_validation
from server.api.model_choice import Served
from server.api.responses.router import ResponsesState, open_response, warm_up
from server.api.responses.schemas import (
    ResponseCompleted,
    ResponseCreated,
    ResponseInProgress,
    ResponseObject,
    ResponsesRequest,
)
from server.api.responses.store import StoredResponse
from server.api.sse import encode_json
from server.api.unicode_body import LONE_SURROGATE, lone_surrogate_at
from server.contracts.errors import ServerError, error_envelope
from server.engine.base import SlotPin
from server.ops.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter()

MAX_MESSAGE_HEADER = "x-codex-websocket-max-message-bytes"
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
_DENIAL = "websocket.http.response"  # the ASGI extension that answers a handshake with HTTP


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    settings: Settings = websocket.app.state.settings
    if not settings.websocket:
        await _refuse(
            websocket,
            426,
            "the Responses WebSocket is turned off on this server (--no-websocket): use "
            "POST /v1/responses",
            "invalid_request_error",
            "websocket_disabled",
        )
        return
    if not carries_api_key(websocket):
        await _refuse(
            websocket,
            401,
            "missing or invalid API key: send it as `Authorization: Bearer <key>` or "
            "`x-api-key: <key>`",
            "authentication_error",
            "invalid_api_key",
        )
        return
    limit = settings.max_request_bytes
    await websocket.accept(headers=[(MAX_MESSAGE_HEADER.encode(), str(limit).encode())])
    await ResponsesSocket(websocket, limit).serve()


async def _refuse(
    websocket: WebSocket, status: int, message: str, error_type: str, code: str
) -> None:
    """The handshake answered with an HTTP error in OpenAI's envelope (a bare 403 where the
    server cannot answer a handshake with HTTP)."""
    if _DENIAL in websocket.scope.get("extensions", {}):
        body = error_envelope(message, error_type, code=code)
        await websocket.send_denial_response(JSONResponse(body, status_code=status))
    else:
        await websocket.close(code=1008)


class ResponsesSocket:
    """One client's socket: its messages read in turn, one response at a time, its last
    response remembered."""

    def __init__(self, websocket: WebSocket, max_bytes: int) -> None:
        self._websocket = websocket
        self._app_state = websocket.app.state
        self._max_bytes = max_bytes
        self._send_lock = asyncio.Lock()
        self._active: asyncio.Task[None] | None = None  # whose terminal event is not out yet
        self._tasks: set[asyncio.Task[None]] = set()  # responses, also those winding down
        self._last: StoredResponse | None = None  # what a previous_response_id may continue
        self._pin = SlotPin()  # the engine slot of its conversation, kept for the socket's life

    async def serve(self) -> None:
        """Read messages until the client closes or goes away; then stop what runs."""
        try:
            while True:
                message = await self._websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                if text is None:
                    await self._error(
                        400, "binary messages are not read: send each request as JSON text"
                    )
                    continue
                await self._read(text)
        except WebSocketDisconnect:
            return
        finally:
            try:
                await self._stop()
            finally:
                self._pin.release()

    async def _read(self, text: str) -> None:
        data = await self._parse(text)
        if data is None:
            return
        kind = data.get("type")
        if kind == "response.processed":
            return  # Codex's acknowledgement of a response it handled: nothing to do
        if kind != "response.create":
            await self._error(
                400,
                f"unknown message type {kind!r}: this socket reads `response.create` "
                "(and `response.processed`)",
                param="type",
            )
            return
        if self._active is not None:
            await self._error(
                409,
                "a response is already running on this socket: send the next response.create "
                "after its terminal event (or open another socket)",
                code="response_in_progress",
            )
            return
        task = asyncio.create_task(self._respond(data))
        self._active = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _parse(self, text: str) -> dict[str, Any] | None:
        """The message's JSON object; None (an error event sent) for one over the limit, not
        JSON, not an object, or with a lone surrogate in a string."""
        size = len(text) if text.isascii() else len(text.encode())
        if size > self._max_bytes:
            await self._error(
                413,
                f"the message is larger than the server's limit of {self._max_bytes} bytes",
                code="request_too_large",
            )
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            await self._error(400, f"the message is not valid JSON: {exc}")
            return None
        if not isinstance(data, dict):
            await self._error(400, "a message is a JSON object with a `type`")
            return None
        if lone_surrogate_at(text.encode(), data) is not None:
            await self._error(400, f"the message is not valid JSON: {LONE_SURROGATE}")
            return None
        return data

    async def _respond(self, data: dict[str, Any]) -> None:
        """One response.create: refused with an error event, or its events to the end."""
        try:
            await self._answer(data)
        except (WebSocketDisconnect, OSError) as exc:
            # the client went away; closing the events stopped the generation
            log.debug("responses socket: the client left during a response (%r)", exc)
        finally:
            self._done()

    async def _answer(self, data: dict[str, Any]) -> None:
        fields = {key: value for key, value in data.items() if key not in ("type", "generate")}
        try:
            body = ResponsesRequest.model_validate(fields)
        except ValidationError as exc:
            message, param = describe_validation(exc.errors())
            await self._error(400, message, param=param)
            return
        state: ResponsesState = self._app_state.responses
        try:
            served = self._app_state.choice.pick(body.model)  # ModelNotFound: an error event
            if data.get("generate") is False:
                await self._warm_up(body, served)
                return
            run = await open_response(
                body,
                self._app_state,
                served,
                own=self._last,
                remember=self._remember,
                pin=self._pin,
            )
        except ServerError as exc:
            await self._send_error(exc.status_code, exc.envelope(), exc.headers)
            return
        except Exception as exc:  # as a POST's 500: the socket stays usable
            log.exception("responses socket: the response could not be opened")
            await self._error(500, f"internal error: {type(exc).__name__}")
            return
        async with aclosing(run.events(state.keepalive_s)) as events:
            async for event in events:
                if event.type in TERMINAL_EVENTS:  # the client may send its next create on it
                    self._done()
                await self._send(encode_json(event.model_dump(mode="json")))

    async def _warm_up(self, body: ResponsesRequest, served: Served) -> None:
        record = await warm_up(body, self._app_state, served, own=self._last)
        self._last = record
        completed = ResponseObject.model_validate(record.response)
        opened = completed.model_copy(update={"status": "in_progress", "completed_at": None})
        for event in (
            ResponseCreated(sequence_number=0, response=opened),
            ResponseInProgress(sequence_number=1, response=opened),
            ResponseCompleted(sequence_number=2, response=completed),
        ):
            await self._send(encode_json(event.model_dump(mode="json")))

    def _done(self) -> None:
        """This task's response is over (its terminal or error event goes out next)."""
        if self._active is asyncio.current_task():
            self._active = None

    def _remember(self, record: StoredResponse) -> None:
        """The finished response becomes what the next create may continue (a failed one
        does not: the conversation goes on from the one before)."""
        if record.response.get("status") not in ("failed", "cancelled"):
            self._last = record

    async def _error(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        error_type = "invalid_request_error" if status < 500 else "server_error"
        await self._send_error(status, error_envelope(message, error_type, param=param, code=code))

    async def _send_error(
        self, status: int, envelope: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        """An error event: OpenAI's envelope with the HTTP status the error has on a POST, and
        its headers (retry-after). It ends the create it answers, if any."""
        self._done()
        event: dict[str, Any] = {"type": "error", "status": status, **envelope}
        if headers:
            event["headers"] = {name.lower(): value for name, value in headers.items()}
        await self._send(encode_json(event))

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            if self._websocket.application_state is WebSocketState.CONNECTED:
                await self._websocket.send_text(text)

    async def _stop(self) -> None:
        """The running response, if any, cancelled: its generation stops."""
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
