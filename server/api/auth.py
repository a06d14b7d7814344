"""API-key check for the /v1 routes when a key is configured.

The key is accepted as `Authorization: Bearer <key>` (OpenAI clients, Claude Code's
ANTHROPIC_AUTH_TOKEN) or as `x-api-key: <key>` (Anthropic's SDKs, ANTHROPIC_API_KEY).
"""

from __future__ import annotations

import hmac

from fastapi import Request
from starlette.requests import HTTPConnection

from server.contracts.errors import ServerError
from server.ops.settings import Settings


class AuthenticationError(ServerError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


async def require_api_key(request: Request) -> None:
    if not carries_api_key(request):
        raise AuthenticationError(
            "missing or invalid API key: send it as `Authorization: Bearer <key>` or "
            "`x-api-key: <key>`"
        )


def carries_api_key(request: HTTPConnection) -> bool:
    """Whether the request (or a WebSocket's handshake) may use the /v1 routes: it carries the
    configured key, or no key is configured."""
    settings: Settings = request.app.state.settings
    if settings.api_key is None:
        return True
    expected = settings.api_key.get_secret_value()
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and _matches(given, expected):
        return True
    api_key = request.headers.get("x-api-key")
    return api_key is not None and _matches(api_key, expected)


def _matches(given: str, expected: str) -> bool:
    """Constant-time comparison (as bytes: a header may hold any latin-1 character)."""
    return hmac.compare_digest(given.strip().encode(), expected.encode())
