"""SSE events stay one line per data field whatever the model wrote."""

from __future__ import annotations

import json

from server.api.sse import sse_data, sse_event

TEXT = "a\u2028b\x85c\u2029d\ne\rf\x0bg\x1ch"  # every character str.splitlines breaks on


def test_line_breaking_characters_are_escaped_and_round_trip() -> None:
    for event in (sse_data({"text": TEXT}), sse_event("x", {"text": TEXT})):
        lines = [line for line in event.decode().splitlines() if line]
        assert lines[-1].startswith("data: ")
        assert len(lines) == (1 if event.startswith(b"data") else 2)
        assert json.loads(lines[-1][len("data: ") :]) == {"text": TEXT}
