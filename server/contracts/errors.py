"""Typed errors and their OpenAI error envelope: {"error": {message, type, param, code}}."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class RequestField(StrEnum):
    """A request field the core validates, by meaning; each API names it its own way on the wire.

    The core raises errors about these; every adapter maps them to its wire names (`WIRE_NAMES`
    in each adapter module) before the error leaves the server.
    """

    CONVERSATION = "conversation"  # chat `messages`, responses `input`, messages `messages`
    MAX_TOKENS = "max_tokens"
    TOOL_CHOICE = "tool_choice"
    RESPONSE_FORMAT = "response_format"  # chat `response_format`, responses `text.format`
    REASONING = "reasoning"


class ServerError(Exception):
    """Base of every error this server raises on purpose; carries its HTTP status and code."""

    status_code = 500
    error_type = "server_error"
    code: str | None = None
    headers: dict[str, str] | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        field: RequestField | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.field = field  # set by the core: the logical field, named on the wire by `named`
        if code is not None:
            self.code = code

    def named(self, wire_names: Mapping[RequestField, str]) -> ServerError:
        """This error with its logical field named as the API's request names it."""
        if self.param is None and self.field is not None:
            self.param = wire_names.get(self.field, self.field.value)
        return self

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.message, self.error_type, param=self.param, code=self.code)


class InvalidRequest(ServerError):
    """The request cannot be served as sent (HTTP 400)."""

    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    """The prompt does not fit the context window.

    Worded as OpenAI words it ("This model's maximum context length is ..."), which OpenAI-API
    clients match to compact or trim; the numbers stay on the error for APIs that word it
    their own way (Anthropic's "prompt is too long: N tokens > M maximum").
    """

    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, n_ctx: int, *, hint: str = "", **kwargs: Any):
        message = (
            f"This model's maximum context length is {n_ctx} tokens. However, your messages "
            f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
        super().__init__(f"{message} {hint}".rstrip(), **kwargs)
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class ServerBusy(ServerError):
    """Too many requests are already waiting for the engine (HTTP 429, with Retry-After)."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, waiting: int, retry_after_s: int = 2):
        super().__init__(
            f"The server is busy: {waiting} requests are waiting. "
            f"Please try again in {retry_after_s}s."
        )
        self.headers = {"Retry-After": str(retry_after_s)}


class EngineUnavailable(ServerError):
    """The engine cannot generate any more (an RPC host dropped): HTTP 503 until a restart."""

    status_code = 503
    error_type = "server_error"
    code = "engine_unavailable"


class NotFound(ServerError):
    status_code = 404
    error_type = "not_found_error"


class StartupError(Exception):
    """The server cannot start; the message says what to do about it."""


class ModelSourceError(StartupError):
    """The --model argument cannot be resolved to a usable gpt-oss GGUF file."""


class VocabularyNotFound(StartupError):
    """No source of the o200k vocabulary that openai-harmony needs could be found."""


class ConfigFileError(StartupError):
    """The config file (--config, $GPT_OSS_CONFIG) cannot be read or names unknown settings."""


class PlacementError(StartupError):
    """The model's size or the GPUs' memory cannot be measured to place the model."""


def error_envelope(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The body OpenAI clients expect for an error."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
