"""Server-sent events on the wire: the only place that formats SSE bytes."""

from __future__ import annotations

import json
from typing import Any

from fastapi.sse import format_sse_event

DONE = format_sse_event(data_str="[DONE]")


# Characters JSON may carry raw but that many line readers (Python's str.splitlines, and so
# httpx's iter_lines; JavaScript engines before ES2019) take for line breaks: escaped, so an
# event's data always stays on its one line whatever the model wrote.
_LINE_BREAKING = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def encode_json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(_LINE_BREAKING)


def sse_data(payload: Any) -> bytes:
    """`data: <json>` event, as Chat Completions streams use."""
    return format_sse_event(data_str=encode_json(payload))


def sse_event(event: str, payload: Any) -> bytes:
    """`event: <name>` + `data: <json>`, as Responses streams use."""
    return format_sse_event(event=event, data_str=encode_json(payload))
