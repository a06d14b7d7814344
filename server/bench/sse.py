"""Streaming HTTP requests: each server-sent event with the time it arrived."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx

from server.bench.plan import BenchError

REQUEST_TIMEOUT_S = 3600.0


def stream_events(
    client: httpx.Client, url: str, body: dict[str, Any]
) -> Iterator[tuple[float, dict[str, Any]]]:
    """POST `body` and yield (perf_counter at arrival, parsed data) per event until [DONE].

    Each request has a connection of its own (llama-server closes a streamed response's
    connection, which a reused keep-alive connection would only notice on the next request).
    """
    headers = {"Connection": "close"}
    with client.stream(
        "POST", url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
    ) as response:
        if response.status_code != 200:
            response.read()
            raise BenchError(f"{url} answered {response.status_code}: {response.text[:500]}")
        for arrived, line in _lines(response):
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            event = json.loads(data)
            if isinstance(event, dict) and "error" in event:
                raise BenchError(f"{url} streamed an error: {event['error']}")
            yield arrived, event


def _lines(response: httpx.Response) -> Iterator[tuple[float, str]]:
    """The stream's lines, each with the perf_counter of the read that completed it. An event
    stream's lines end at a line feed (after a carriage return or not); httpx's `iter_lines`
    also ends one at U+2028, U+0085 and the other separators `str.splitlines` knows, which a
    JSON string may hold as they are (a sampled token's text)."""
    pending = b""
    for chunk in response.iter_bytes():
        arrived = time.perf_counter()
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield arrived, line.removesuffix(b"\r").decode()
    if pending:
        yield time.perf_counter(), pending.decode()
