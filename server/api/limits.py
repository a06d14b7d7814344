"""Request body size limit, enforced before the body is parsed (HTTP 413, in the envelope of the
API the request was made to: Anthropic's on /v1/messages, else OpenAI's)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.messages.errors import anthropic_envelope, is_messages_path
from server.contracts.errors import error_envelope


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands out the buffered body once, then the original messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodyLimitMiddleware:
    """Refuses bodies over `max_bytes`: by Content-Length up front; a body without one is read
    in (up to the limit) before the app sees it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                await self._refuse(scope, send)
                return
            await self.app(scope, receive, send)
            return
        body = await self._read_limited(receive)  # no declared length: count it in
        if body is None:
            await self._refuse(scope, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_limited(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        message = f"the request body is larger than the server's limit of {self.max_bytes} bytes"
        if is_messages_path(str(scope.get("path", ""))):
            body = anthropic_envelope(413, message)
        else:
            body = error_envelope(message, "invalid_request_error", code="request_too_large")
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
