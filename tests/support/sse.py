"""Read server-sent events the way clients do: `event:` / `data:` lines, blank-line separated."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class SSEEvent:
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(lines: Iterable[str]) -> list[SSEEvent]:
    events: list[SSEEvent] = []
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                events.append(SSEEvent(name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].lstrip())
    if data:
        events.append(SSEEvent(name, "\n".join(data)))
    return events
