"""One request of the mix and what came of it: status, timing, and whether its stream ended
with the terminal event of its API."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from server.bench.load.mix import PATHS, RequestSpec

RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass
class Outcome:
    spec: RequestSpec
    status: int | None = None  # None: no HTTP answer (transport error)
    latency_s: float = 0.0  # until the last byte (cancelled: until the client closed)
    first_event_s: float | None = None  # streams: until the first data event
    events: int = 0  # streams: data events read
    cancelled: bool = False  # the client closed the stream on purpose
    terminal_ok: bool | None = None  # streams read to the end, and valid JSON answers
    queue_ms: float | None = None  # chat: the server's timings.queue_ms
    retry_after: str | None = None  # 429: the Retry-After header
    error: str | None = None


class _StreamCheck:
    """Follows a stream's data events to tell whether it ended with its terminal event."""

    def __init__(self, spec: RequestSpec) -> None:
        self.spec = spec
        self.last: Any = None  # the last event (parsed; "[DONE]" as is)
        self.finished = False  # chat: a chunk with a finish_reason came
        self.after_terminal = False  # something came after the terminal event
        self.queue_ms: float | None = None

    def observe(self, data: str) -> None:
        if self.terminal:
            self.after_terminal = True
        event: Any = data if data == "[DONE]" else json.loads(data)
        if isinstance(event, dict):
            for choice in event.get("choices") or []:
                self.finished = self.finished or bool(choice.get("finish_reason"))
            timings = event.get("timings")
            if isinstance(timings, dict) and "queue_ms" in timings:
                self.queue_ms = float(timings["queue_ms"])
        self.last = event

    @property
    def terminal(self) -> bool:
        if self.spec.endpoint == "chat":
            return self.last == "[DONE]" and self.finished
        return isinstance(self.last, dict) and self.last.get("type") in RESPONSES_TERMINAL

    @property
    def ok(self) -> bool:
        return self.terminal and not self.after_terminal


def json_answer_ok(spec: RequestSpec, body: Any) -> tuple[bool, float | None]:
    """Whether a non-streaming answer is complete, and the chat's queue_ms."""
    if not isinstance(body, dict):
        return False, None
    if spec.endpoint == "chat":
        choices = body.get("choices") or []
        ok = bool(choices) and bool(choices[0].get("finish_reason"))
        queue_ms = (body.get("timings") or {}).get("queue_ms")
        return ok, None if queue_ms is None else float(queue_ms)
    return body.get("status") in ("completed", "incomplete", "failed"), None


async def send(client: httpx.AsyncClient, base: str, spec: RequestSpec) -> Outcome:
    outcome = Outcome(spec)
    started = time.perf_counter()
    try:
        if spec.stream:
            await _stream(client, base, spec, outcome, started)
        else:
            response = await client.post(base + PATHS[spec.endpoint], json=spec.body())
            _status(outcome, response)
            if response.status_code == 200:
                outcome.terminal_ok, outcome.queue_ms = json_answer_ok(spec, response.json())
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.latency_s = time.perf_counter() - started
    return outcome


async def _stream(
    client: httpx.AsyncClient, base: str, spec: RequestSpec, outcome: Outcome, started: float
) -> None:
    check = _StreamCheck(spec)
    async with client.stream("POST", base + PATHS[spec.endpoint], json=spec.body()) as response:
        _status(outcome, response)
        if response.status_code != 200:
            await response.aread()
            return
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            if outcome.first_event_s is None:
                outcome.first_event_s = time.perf_counter() - started
            outcome.events += 1
            check.observe(line[len("data:") :].strip())
            if spec.cancel_after is not None and outcome.events >= spec.cancel_after:
                outcome.cancelled = not check.terminal
                break  # leaving the block closes the connection mid-stream
    outcome.queue_ms = check.queue_ms
    if not outcome.cancelled:
        outcome.terminal_ok = check.ok


def _status(outcome: Outcome, response: httpx.Response) -> None:
    outcome.status = response.status_code
    outcome.retry_after = response.headers.get("retry-after")
