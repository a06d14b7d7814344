"""One request of the mix and what came of it: status, timing, whether its stream ended with
the terminal event of its API, and the tool calls it answered with; a tool loop is sent round
after round, each call answered with a result."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from devkit.load_test.mix import PATHS, RequestSpec, ToolCall

RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
MESSAGES_TERMINAL = frozenset({"message_stop", "error"})
FAILED_TERMINAL = frozenset({"response.failed", "error"})


@dataclass
class Outcome:
    spec: RequestSpec
    round: int = 0  # tool loops: which round this HTTP request was
    status: int | None = None  # None: no HTTP answer (transport error)
    latency_s: float = 0.0  # until the last byte (cancelled: until the client closed)
    first_event_s: float | None = None  # streams: until the first data event
    events: int = 0  # streams: data events read
    cancelled: bool = False  # the client closed the stream on purpose
    terminal_ok: bool | None = None  # streams read to the end, and valid JSON answers
    failed_terminal: bool = False  # the terminal was the API's failure event
    queue_ms: float | None = None  # chat: the server's timings.queue_ms
    retry_after: str | None = None  # 429: the Retry-After header
    error: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def label(self) -> str:
        suffix = f".{self.round}" if self.spec.loop else ""
        return f"#{self.spec.index}{suffix} {self.spec.kind}"


class _StreamCheck:
    """Follows a stream's data events: whether it ended with its terminal event, and the tool
    calls it carried."""

    def __init__(self, spec: RequestSpec) -> None:
        self.spec = spec
        self.last: Any = None  # the last event (parsed; "[DONE]" as is)
        self.finished = False  # chat: a chunk with a finish_reason came
        self.after_terminal = False  # something came after the terminal event
        self.queue_ms: float | None = None
        self._calls: dict[int, dict[str, str]] = {}  # chat, messages: by index, accumulated
        self._final_calls: list[ToolCall] = []  # responses: from the terminal response

    def observe(self, data: str) -> None:
        if self.terminal:
            self.after_terminal = True
        event: Any = data if data == "[DONE]" else json.loads(data)
        if isinstance(event, dict):
            if self.spec.endpoint == "chat":
                self._chat(event)
            elif self.spec.endpoint == "messages":
                self._messages(event)
            elif event.get("type") in RESPONSES_TERMINAL:
                self._final_calls = responses_calls(event.get("response"))
        self.last = event

    def _chat(self, event: dict[str, Any]) -> None:
        for choice in event.get("choices") or []:
            self.finished = self.finished or bool(choice.get("finish_reason"))
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                call = self._calls.setdefault(delta.get("index", 0), {})
                function = delta.get("function") or {}
                call["id"] = delta.get("id") or call.get("id", "")
                call["name"] = function.get("name") or call.get("name", "")
                call["arguments"] = call.get("arguments", "") + (function.get("arguments") or "")
        timings = event.get("timings")
        if isinstance(timings, dict) and "queue_ms" in timings:
            self.queue_ms = float(timings["queue_ms"])

    def _messages(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                self._calls[event.get("index", 0)] = {
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "arguments": "",
                }
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            call = self._calls.get(event.get("index", 0))
            if call is not None and delta.get("type") == "input_json_delta":
                call["arguments"] += delta.get("partial_json") or ""

    @property
    def terminal(self) -> bool:
        if self.spec.endpoint == "chat":
            return self.last == "[DONE]" and self.finished
        terminals = RESPONSES_TERMINAL if self.spec.endpoint == "responses" else MESSAGES_TERMINAL
        return isinstance(self.last, dict) and self.last.get("type") in terminals

    @property
    def ok(self) -> bool:
        return self.terminal and not self.after_terminal

    @property
    def failed(self) -> bool:
        return isinstance(self.last, dict) and self.last.get("type") in FAILED_TERMINAL

    @property
    def tool_calls(self) -> list[ToolCall]:
        if self.spec.endpoint == "responses":
            return self._final_calls
        return [
            ToolCall(c["id"], c["name"], c["arguments"] or "{}")
            for _, c in sorted(self._calls.items())
            if c.get("id") and c.get("name")
        ]


def responses_calls(response: Any) -> list[ToolCall]:
    if not isinstance(response, dict):
        return []
    return [
        ToolCall(item["call_id"], item["name"], item.get("arguments") or "{}")
        for item in response.get("output") or []
        if item.get("type") == "function_call" and item.get("call_id") and item.get("name")
    ]


def json_answer(spec: RequestSpec, body: Any) -> tuple[bool, float | None, list[ToolCall]]:
    """Whether a non-streaming answer is complete, the chat's queue_ms, and its tool calls."""
    if not isinstance(body, dict):
        return False, None, []
    if spec.endpoint == "chat":
        choices = body.get("choices") or []
        ok = bool(choices) and bool(choices[0].get("finish_reason"))
        queue_ms = (body.get("timings") or {}).get("queue_ms")
        message = choices[0].get("message") or {} if choices else {}
        calls = [
            ToolCall(c["id"], c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in message.get("tool_calls") or []
        ]
        return ok, None if queue_ms is None else float(queue_ms), calls
    if spec.endpoint == "responses":
        ok = body.get("status") in ("completed", "incomplete", "failed")
        return ok, None, responses_calls(body)
    ok = body.get("type") == "message" and bool(body.get("stop_reason"))
    calls = [
        ToolCall(b["id"], b["name"], json.dumps(b.get("input") or {}))
        for b in body.get("content") or []
        if b.get("type") == "tool_use"
    ]
    return ok, None, calls


async def send(client: httpx.AsyncClient, base: str, spec: RequestSpec) -> list[Outcome]:
    """The request, or each round of a tool loop (a round that answers with tool calls is
    continued with their results, up to `spec.rounds`)."""
    outcomes: list[Outcome] = []
    calls: list[list[ToolCall]] = []
    while True:
        outcome = await _send_round(client, base, spec, calls)
        outcomes.append(outcome)
        if outcome.status != 200 or not outcome.tool_calls or len(outcomes) >= spec.rounds:
            return outcomes
        calls.append(outcome.tool_calls)


async def _send_round(
    client: httpx.AsyncClient, base: str, spec: RequestSpec, calls: list[list[ToolCall]]
) -> Outcome:
    outcome = Outcome(spec, round=len(calls))
    body = spec.body(calls)
    started = time.perf_counter()
    try:
        if spec.stream:
            await _stream(client, base, body, outcome, started)
        else:
            response = await client.post(base + PATHS[spec.endpoint], json=body)
            _status(outcome, response)
            if response.status_code == 200:
                outcome.terminal_ok, outcome.queue_ms, outcome.tool_calls = json_answer(
                    spec, response.json()
                )
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.latency_s = time.perf_counter() - started
    return outcome


async def _stream(
    client: httpx.AsyncClient, base: str, body: dict[str, Any], outcome: Outcome, started: float
) -> None:
    spec = outcome.spec
    check = _StreamCheck(spec)
    async with client.stream("POST", base + PATHS[spec.endpoint], json=body) as response:
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
        outcome.failed_terminal = check.failed
        outcome.tool_calls = check.tool_calls


def _status(outcome: Outcome, response: httpx.Response) -> None:
    outcome.status = response.status_code
    outcome.retry_after = response.headers.get("retry-after")
