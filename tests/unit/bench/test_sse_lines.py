"""The bench's event-stream reader ends lines where an event stream does, and only there.

A sampled token's text may hold U+2028 or U+0085 as they are inside a JSON string (llama-server
writes them so); httpx's `iter_lines` ended a line there, and the bench failed on the half
event. A real HTTP server streams the body in pieces that split lines and events anywhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from server.bench.sse import stream_events
from tests.support.local_http import serve_handler

EVENTS = [
    {"content": "line\u2028separator"},
    {"content": "next\u0085line", "n": 2},
    {"content": "para\u2029graph \x1c\x1d\x1e \u000b\u000c"},
    {"content": "plain"},
]


def _body() -> bytes:
    events = [f"data: {json.dumps(event, ensure_ascii=False)}" for event in EVENTS]
    lines = [": a comment", events[0], "", events[1] + "\r", "", events[2], "", events[3], ""]
    return ("\n".join(lines) + "\ndata: [DONE]\n\n").encode()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = _body()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for start in range(0, len(body), 7):  # pieces that split lines, and characters
            self.wfile.write(body[start : start + 7])
            self.wfile.flush()
            time.sleep(0.001)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    with serve_handler(_Handler) as root:
        yield f"{root}/stream"


def test_unicode_line_separators_stay_inside_their_event(url: str) -> None:
    with httpx.Client() as client:
        received = list(stream_events(client, url, {"stream": True}))
    assert [event for _, event in received] == EVENTS
    arrivals = [arrived for arrived, _ in received]
    assert arrivals == sorted(arrivals)
