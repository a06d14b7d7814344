"""API-key check for the /v1 routes: `Authorization: Bearer <key>` when a key is configured."""

from __future__ import annotations

import hmac

from fastapi import Request

from server.contracts.errors import ServerError
from server.ops.config import Settings


class AuthenticationError(ServerError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


async def require_api_key(request: Request) -> None:
    settings: Settings = request.app.state.settings
    if settings.api_key is None:
        return
    expected = settings.api_key.get_secret_value()
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), expected):
        raise AuthenticationError(
            "missing or invalid API key: send it as `Authorization: Bearer <key>`"
        )
