"""Anthropic's error envelope, {"type": "error", "error": {type, message}}, and its error types.

Errors on the /v1/messages paths leave the server in this shape (server.api.error_handlers and
the body-size limit ask `is_messages_path`); the error type follows the HTTP status as in
Anthropic's API. Where clients act on an error's words, it is worded as Anthropic words it: a
prompt longer than the context is `prompt is too long: N tokens > M maximum`, which Claude Code
answers by compacting (or stopping with "Prompt is too long") rather than retrying.
"""

from __future__ import annotations

from typing import Any

from server.api.messages.schemas import ErrorBody, ErrorEvent
from server.contracts.errors import ContextLengthExceeded, InvalidRequest

MESSAGES_PATH = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",  # the engine cannot serve now: clients back off and retry
    504: "timeout_error",
    529: "overloaded_error",
}


def is_messages_path(path: str) -> bool:
    """Whether a request path is one of this API's (`/v1/messages`, `/v1/messages/...`)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    known = ERROR_TYPES.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_event(status: int, message: str) -> ErrorEvent:
    return ErrorEvent(error=ErrorBody(type=error_type(status), message=message))


def anthropic_envelope(status: int, message: str) -> dict[str, Any]:
    """The body of an error response: `{"type": "error", "error": {"type", "message"}}`."""
    return error_event(status, message).model_dump(mode="json")


def prompt_too_long(exc: ContextLengthExceeded) -> InvalidRequest:
    """The context overflow in Anthropic's words, exactly (Claude Code matches the whole
    message: `^prompt is too long: \\d+ tokens > \\d+ maximum$`), with no field name before it."""
    return InvalidRequest(f"prompt is too long: {exc.prompt_tokens} tokens > {exc.n_ctx} maximum")
