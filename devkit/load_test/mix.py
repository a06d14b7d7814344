"""The seeded request mix: API, streaming or not, tools, tool loops, cancelled streams; the
bodies of each round in each API's shape."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["chat", "responses", "messages"]
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "responses", "messages")
PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
TOOL_SHARE = 1 / 3  # requests offering the tool (the model may call it or not)
LOOP_SHARE = 0.2  # requests that are tool loops (the tool forced until the last round)
LOOP_ROUNDS = 3  # rounds of a tool loop: forced calls, then a round with tool_choice auto
LOOP_MAX_TOKENS = 96  # a forced round's output limit: room for a call after the reasoning
LOOP_REASONING_BUDGET = 8  # a random model reasons on and on: the budget ends it, then the call
CANCEL_AFTER_EVENTS = (2, 6)  # a cancelled stream is closed after this many data events

_TOPICS = (
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "List three prime numbers.",
    "What's the weather like in Paris today?",
)
TOOL_NAME = "get_weather"
_WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
}
_WEATHER_DESCRIPTION = "Current weather in a city."


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the server answered with, as the next round sends it back."""

    call_id: str
    name: str
    arguments: str  # JSON text (chat, responses); messages sends it parsed as `input`


@dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    endpoint: Endpoint
    stream: bool
    tools: bool
    max_tokens: int
    cancel_after: int | None  # close the stream after this many data events; None: read to end
    rounds: int = 1  # > 1: a tool loop of this many rounds at most

    @property
    def kind(self) -> str:
        return f"{self.endpoint}/{'stream' if self.stream else 'json'}"

    @property
    def loop(self) -> bool:
        return self.rounds > 1

    def body(self, calls: Sequence[Sequence[ToolCall]] = ()) -> dict[str, Any]:
        """The body of round `len(calls)`: `calls[r]` are the calls round r answered with, each
        sent back with its result."""
        text = f"{_TOPICS[self.index % len(_TOPICS)]} (request {self.index})"
        body: dict[str, Any] = {"model": "load-test", "stream": self.stream}
        round_ = len(calls)
        forced = self.loop and round_ < self.rounds - 1
        limit = LOOP_MAX_TOKENS if forced else self.max_tokens
        if self.endpoint == "chat":
            body |= _chat(text, calls, self.stream)
            body["max_tokens"] = limit
            body["seed"] = self.index + round_
        elif self.endpoint == "responses":
            body |= _responses(text, calls)
            body["max_output_tokens"] = limit
            body["seed"] = self.index + round_
            body["store"] = self.index % 2 == 0
        else:
            body |= _messages(text, calls)
            body["max_tokens"] = limit
        if self.tools or self.loop:
            body["tools"] = [_TOOL_SHAPES[self.endpoint]]
        if self.loop:
            _budget(body, self.endpoint, LOOP_REASONING_BUDGET)
            named = (self.index + round_) % 2 == 0
            body["tool_choice"] = _CHOICES[self.endpoint][
                ("named" if named else "required") if forced else "auto"
            ]
        return body


_TOOL_SHAPES: dict[Endpoint, dict[str, Any]] = {
    "chat": {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": _WEATHER_DESCRIPTION,
            "parameters": _WEATHER_PARAMETERS,
        },
    },
    "responses": {
        "type": "function",
        "name": TOOL_NAME,
        "description": _WEATHER_DESCRIPTION,
        "parameters": _WEATHER_PARAMETERS,
    },
    "messages": {
        "name": TOOL_NAME,
        "description": _WEATHER_DESCRIPTION,
        "input_schema": _WEATHER_PARAMETERS,
    },
}
_CHOICES: dict[Endpoint, dict[str, Any]] = {
    "chat": {
        "required": "required",
        "named": {"type": "function", "function": {"name": TOOL_NAME}},
        "auto": "auto",
    },
    "responses": {
        "required": "required",
        "named": {"type": "function", "name": TOOL_NAME},
        "auto": "auto",
    },
    "messages": {
        "required": {"type": "any"},
        "named": {"type": "tool", "name": TOOL_NAME},
        "auto": {"type": "auto"},
    },
}


def _budget(body: dict[str, Any], endpoint: Endpoint, tokens: int) -> None:
    """The reasoning budget in each API's shape: the analysis is ended after `tokens`."""
    if endpoint == "chat":
        body["reasoning"] = {"max_tokens": tokens}
    elif endpoint == "responses":
        body["reasoning"]["max_tokens"] = tokens
    else:
        body["thinking"] = {"type": "enabled", "budget_tokens": tokens}


def _result(call: ToolCall) -> str:
    return json.dumps({"call": call.call_id, "temperature_c": 12 + len(call.arguments) % 9})


def _chat(text: str, calls: Sequence[Sequence[ToolCall]], stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    for round_calls in calls:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in round_calls
                ],
            }
        )
        messages += [
            {"role": "tool", "tool_call_id": c.call_id, "content": _result(c)} for c in round_calls
        ]
    body: dict[str, Any] = {"messages": messages, "reasoning_effort": "low"}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _responses(text: str, calls: Sequence[Sequence[ToolCall]]) -> dict[str, Any]:
    if not calls:
        return {"input": text, "reasoning": {"effort": "low"}}
    items: list[dict[str, Any]] = [{"role": "user", "content": text}]
    for round_calls in calls:
        for c in round_calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments,
                }
            )
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": _result(c)}
            for c in round_calls
        ]
    return {"input": items, "reasoning": {"effort": "low"}}


def _messages(text: str, calls: Sequence[Sequence[ToolCall]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    for round_calls in calls:
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": c.call_id, "name": c.name, "input": _input(c)}
                    for c in round_calls
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.call_id, "content": _result(c)}
                    for c in round_calls
                ],
            }
        )
    return {"messages": messages, "output_config": {"effort": "low"}}


def _input(call: ToolCall) -> dict[str, Any]:
    try:
        parsed = json.loads(call.arguments)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _draw(
    rng: random.Random, index: int, cancel: bool, max_tokens: int, loop_share: float
) -> RequestSpec:
    endpoint, stream = rng.choice(ENDPOINTS), rng.random() < 0.5
    loop = rng.random() < loop_share
    tools = loop or rng.random() < TOOL_SHARE
    limit = rng.randint(max(1, max_tokens // 2), max_tokens)  # a loop's: its last round's
    cancel_after = rng.randint(*CANCEL_AFTER_EVENTS) if cancel and stream and not loop else None
    return RequestSpec(
        index, endpoint, stream, tools, limit, cancel_after, LOOP_ROUNDS if loop else 1
    )


def plan_requests(
    n: int,
    seed: int,
    cancel_fraction: float,
    max_tokens: int,
    *,
    start: int = 0,
    loop_share: float = LOOP_SHARE,
) -> list[RequestSpec]:
    """n requests: API and streaming drawn evenly, `loop_share` tool loops, a third of the rest
    with tools, output limits between max_tokens / 2 and max_tokens (a loop's forced rounds:
    LOOP_MAX_TOKENS), and
    round(cancel_fraction * streams) of the streams that are not loops cancelled."""
    rng = random.Random(seed)
    specs = [_draw(rng, start + i, False, max_tokens, loop_share) for i in range(n)]
    streams = [i for i, s in enumerate(specs) if s.stream and not s.loop]
    for i in rng.sample(streams, round(cancel_fraction * len(streams))):
        specs[i] = dataclasses.replace(specs[i], cancel_after=rng.randint(*CANCEL_AFTER_EVENTS))
    return specs


def endless_requests(
    seed: int, cancel_fraction: float, max_tokens: int, *, start: int, loop_share: float
) -> Iterator[RequestSpec]:
    """The soak's unending mix: the same draws as `plan_requests`, each stream that is not a
    loop cancelled with probability `cancel_fraction`."""
    rng = random.Random(seed)
    index = start
    while True:
        yield _draw(rng, index, rng.random() < cancel_fraction, max_tokens, loop_share)
        index += 1


def warmup_requests(start: int, *, loops: bool) -> list[RequestSpec]:
    """One request of every kind, with and without tools, one tool loop per API (`loops`), plus
    one cancelled stream."""
    specs: list[RequestSpec] = []
    for endpoint in ENDPOINTS:
        for stream in (False, True):
            for tools in (False, True):
                specs.append(RequestSpec(start + len(specs), endpoint, stream, tools, 16, None))
        if loops:
            specs.append(
                RequestSpec(start + len(specs), endpoint, False, True, 16, None, LOOP_ROUNDS)
            )
    specs.append(RequestSpec(start + len(specs), "chat", True, False, 64, 3))
    return specs
