"""Every error leaves the server in its API's error envelope, with a fitting status code.

OpenAI's envelope (`{"error": {message, type, param, code}}`) everywhere, except on the
/v1/messages paths, which answer in Anthropic's (`{"type": "error", "error": {type, message}}`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from server.api.messages.errors import anthropic_envelope, is_messages_path
from server.contracts.errors import ServerError, error_envelope

log = logging.getLogger(__name__)

_HTTP_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error"}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServerError, _server_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)


def _respond(
    request: Request,
    status: int,
    message: str,
    error_type: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The error in the envelope of the API the request was made to."""
    if is_messages_path(request.url.path):
        if param is not None and param not in message:
            message = f"{param}: {message}"
        body = anthropic_envelope(status, message)
    else:
        body = error_envelope(message, error_type, param=param, code=code)
    return JSONResponse(body, status_code=status, headers=headers)


async def _server_error(request: Request, exc: ServerError) -> JSONResponse:
    return _respond(
        request,
        exc.status_code,
        exc.message,
        exc.error_type,
        param=exc.param,
        code=exc.code,
        headers=exc.headers,
    )


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = describe_validation(exc.errors())
    return _respond(request, 400, message, "invalid_request_error", param=param)


def describe_validation(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """pydantic's errors about a request body as one message and the field it names (its
    `param`), as a 400 says them (also on the Responses WebSocket)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        context = first.get("ctx")
        detail = context.get("error", "") if isinstance(context, dict) else ""
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    return message, param


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    error_type = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
    return _respond(request, exc.status_code, str(exc.detail), error_type, headers=exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    return _respond(request, 500, f"internal error: {type(exc).__name__}", "server_error")
