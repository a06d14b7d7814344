"""The seeded request mix: endpoint, streaming or not, tools, and which streams are cancelled."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["chat", "responses"]
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "responses")
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
TOOL_SHARE = 1 / 3
CANCEL_AFTER_EVENTS = (2, 6)  # a cancelled stream is closed after this many data events

_TOPICS = (
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is the capital of France?",
    "Explain recursion in one sentence.",
    "List three prime numbers.",
    "What's the weather like in Paris today?",
)
_WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    endpoint: Endpoint
    stream: bool
    tools: bool
    max_tokens: int
    cancel_after: int | None  # close the stream after this many data events; None: read to end

    @property
    def kind(self) -> str:
        return f"{self.endpoint}/{'stream' if self.stream else 'json'}"

    def body(self) -> dict[str, Any]:
        text = f"{_TOPICS[self.index % len(_TOPICS)]} (request {self.index})"
        body: dict[str, Any] = {"model": "load-test", "stream": self.stream, "seed": self.index}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
            body["max_tokens"] = self.max_tokens
            body["reasoning_effort"] = "low"
            if self.stream:
                body["stream_options"] = {"include_usage": True}
            if self.tools:
                body["tools"] = [{"type": "function", "function": _WEATHER}]
        else:
            body["input"] = text
            body["max_output_tokens"] = self.max_tokens
            body["reasoning"] = {"effort": "low"}
            body["store"] = self.index % 2 == 0
            if self.tools:
                body["tools"] = [{"type": "function", **_WEATHER}]
        return body


def plan_requests(
    n: int, seed: int, cancel_fraction: float, max_tokens: int, start: int = 0
) -> list[RequestSpec]:
    """n requests: endpoint and streaming drawn evenly, a third with tools, output limits
    between max_tokens / 2 and max_tokens, and round(cancel_fraction * streams) of the
    streams cancelled."""
    rng = random.Random(seed)
    draws = [
        (rng.choice(ENDPOINTS), rng.random() < 0.5, rng.random() < TOOL_SHARE) for _ in range(n)
    ]
    streams = [i for i, (_, stream, _) in enumerate(draws) if stream]
    cancelled = set(rng.sample(streams, round(cancel_fraction * len(streams))))
    specs = []
    for i, (endpoint, stream, tools) in enumerate(draws):
        cancel_after = rng.randint(*CANCEL_AFTER_EVENTS) if i in cancelled else None
        limit = rng.randint(max(1, max_tokens // 2), max_tokens)
        specs.append(RequestSpec(start + i, endpoint, stream, tools, limit, cancel_after))
    return specs


def warmup_requests(start: int) -> list[RequestSpec]:
    """One request of every kind, with and without tools, plus one cancelled stream."""
    specs: list[RequestSpec] = []
    for endpoint in ENDPOINTS:
        for stream in (False, True):
            for tools in (False, True):
                specs.append(RequestSpec(start + len(specs), endpoint, stream, tools, 16, None))
    specs.append(RequestSpec(start + len(specs), "chat", True, False, 64, 3))
    return specs
