"""Every error leaves the server in OpenAI's error envelope, with a fitting status code."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from server.contracts.errors import ServerError, error_envelope

log = logging.getLogger(__name__)

_HTTP_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error"}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServerError, _server_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)


async def _server_error(_request: Request, exc: ServerError) -> JSONResponse:
    return JSONResponse(exc.envelope(), status_code=exc.status_code, headers=exc.headers)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        context = first.get("ctx")
        detail = context.get("error", "") if isinstance(context, dict) else ""
        message = f"the request body is not valid JSON: {detail}".rstrip(": ")
        return JSONResponse(error_envelope(message, "invalid_request_error"), status_code=400)
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problems)"
    body = error_envelope(message, "invalid_request_error", param=param)
    return JSONResponse(body, status_code=400)


async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    error_type = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
    body = error_envelope(str(exc.detail), error_type)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _unexpected_error(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    body = error_envelope(f"internal error: {type(exc).__name__}", "server_error")
    return JSONResponse(body, status_code=500)
