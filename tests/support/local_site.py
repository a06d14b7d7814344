"""A small web site on 127.0.0.1 for the browser tool's tests: pages by path, redirects, and a
SearXNG-compatible JSON search endpoint (`/search?q=…&format=json`) whose results name pages of
the site by path (or any other URL as it is)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.local_http import serve_handler

Page = tuple[str, str]  # content type, body


@contextmanager
def serve_site(
    pages: Mapping[str, Page],
    results: Sequence[Mapping[str, str]] = (),
    redirects: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """The site served in a thread; yields its root URL. A result's `url` that starts with `/`
    is a page of this site; every other path answers 404."""
    moved = dict(redirects or {})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/search":
                query = parse_qs(parts.query)
                assert query["format"] == ["json"]
                found = [_absolute(dict(result), self.root()) for result in results]
                self._send(
                    200, "application/json", json.dumps({"query": query["q"][0], "results": found})
                )
            elif parts.path in pages:
                kind, body = pages[parts.path]
                self._send(200, kind, body)
            elif parts.path in moved:
                self.send_response(302)
                self.send_header("Location", moved[parts.path])
                self.end_headers()
            else:
                self._send(404, "text/plain", "no")

        def root(self) -> str:
            assert isinstance(self.server, HTTPServer)
            return f"http://127.0.0.1:{self.server.server_port}"

        def _send(self, status: int, kind: str, body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with serve_handler(Handler) as root:
        yield root


def _absolute(result: dict[str, Any], root: str) -> dict[str, Any]:
    if result["url"].startswith("/"):
        result["url"] = root + result["url"]
    return result
