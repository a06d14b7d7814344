"""The chat page at `/`: static files from package data, under a strict Content-Security-Policy.

Only the files shipped in server/web/static are served (no directory listing, no path outside
it); no API key is needed for them, the page asks for one when the API answers 401. The policy
allows scripts, styles and requests from this origin only: no inline code, nothing external.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from server.contracts.errors import ServerError

router = APIRouter(include_in_schema=False)

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


class StaticNotFound(ServerError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


def _static_file(name: str) -> Response:
    """One of the shipped files, by its exact name (names are listed, never resolved as paths)."""
    static = resources.files("server.web").joinpath("static")
    media_type = MEDIA_TYPES.get(name[name.rfind(".") :] if "." in name else "")
    entries = {entry.name: entry for entry in static.iterdir() if entry.is_file()}
    if media_type is None or name not in entries:
        raise StaticNotFound(f"no such file: /static/{name}")
    return Response(entries[name].read_bytes(), media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/")
async def index() -> Response:
    return _static_file("index.html")


@router.get("/static/{name}")
async def static_file(name: str) -> Response:
    return _static_file(name)
