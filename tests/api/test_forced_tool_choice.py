"""tool_choice on the real tiny engine, sampled for real over many seeds, in all three APIs.

A forced choice (Chat's named or `required`, Messages' `tool` or `any`, a Responses custom tool
by name) must produce the call, as OpenAI's and Anthropic's APIs do: reasoning may come first,
a preamble or an answer may not. `tool_choice: none` must never produce one. Random weights at
temperature 1 are the adversary; a small reasoning budget ends the analysis, and the tools'
arguments are bounded by their grammars, so every generation finishes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.responses import MODEL, responses_client

SEEDS = range(20)
SERVER_SEED = 1234  # the seed of the requests that give none (Messages)
BUDGET = 4  # reasoning tokens before the next header is forced
UNIT = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
NAMES = ("get_weather", "get_time")
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": n, "description": f"The {n} tool.", "parameters": UNIT},
    }
    for n in NAMES
]
MESSAGES_TOOLS = [{"name": n, "description": f"The {n} tool.", "input_schema": UNIT} for n in NAMES]
RESPONSES_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather.", "parameters": UNIT},
    {
        "type": "custom",
        "name": "answer",
        "description": "Say yes or no.",
        "format": {"type": "grammar", "syntax": "regex", "definition": "(yes|no)"},
    },
]


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """Messages has no `seed`: the server's (--seed) fixes its draws, so a failure reproduces
    (each case's prompt differs: its draws do too)."""
    store = tmp_path_factory.mktemp("store")
    with responses_client(runtime, store, seed=SERVER_SEED) as test_client:
        yield test_client


def user(seed: int) -> str:
    return f"Weather, case {seed}?"


def chat(client: TestClient, seed: int, **body: Any) -> dict[str, Any]:
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": user(seed)}],
        "reasoning": {"max_tokens": BUDGET},
        "max_tokens": 80,
        "seed": seed,
        "temperature": 1.0,
        **body,
    }
    response = client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]  # type: ignore[no-any-return]


def messages(client: TestClient, seed: int, **body: Any) -> dict[str, Any]:
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": user(seed)}],
        "thinking": {"type": "enabled", "budget_tokens": BUDGET},
        "max_tokens": 80,
        "temperature": 1.0,
        **body,
    }
    response = client.post("/v1/messages", json=request)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def responses(client: TestClient, seed: int, **body: Any) -> dict[str, Any]:
    request = {
        "model": MODEL,
        "input": user(seed),
        "reasoning": {"max_tokens": BUDGET},
        "max_output_tokens": 80,
        "temperature": 1.0,
        "store": False,
        "seed": seed,
        **body,
    }
    response = client.post("/v1/responses", json=request)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("choice", "names", "seeds"),
    [
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}, SEEDS),
        ("required", set(NAMES), SEEDS[:5]),
    ],
    ids=["named", "required"],
)
def test_chat_forced_choice_always_calls(
    client: TestClient, choice: str | dict[str, Any], names: set[str], seeds: range
) -> None:
    wrong = {}
    for seed in seeds:
        result = chat(client, seed, tools=CHAT_TOOLS, tool_choice=choice)
        message = result["message"]
        calls = message.get("tool_calls") or []
        called = len(calls) == 1 and calls[0]["function"]["name"] in names
        if not called or result["finish_reason"] != "tool_calls" or message.get("content"):
            wrong[seed] = message  # no call, or a preamble or an answer beside it
    assert not wrong, f"{len(wrong)} of {len(seeds)} seeds: {wrong}"


@pytest.mark.parametrize(
    ("choice", "names", "seeds"),
    [
        ({"type": "tool", "name": "get_time"}, {"get_time"}, SEEDS),
        ({"type": "any"}, set(NAMES), SEEDS[:5]),
    ],
    ids=["tool", "any"],
)
def test_messages_forced_choice_always_calls(
    client: TestClient, choice: dict[str, Any], names: set[str], seeds: range
) -> None:
    wrong = {}
    for seed in seeds:
        body = messages(client, seed, tools=MESSAGES_TOOLS, tool_choice=choice)
        uses = [block for block in body["content"] if block["type"] == "tool_use"]
        texts = [block for block in body["content"] if block["type"] == "text"]
        called = len(uses) == 1 and uses[0]["name"] in names
        if not called or texts or body["stop_reason"] != "tool_use":
            wrong[seed] = body["content"]
        else:
            assert uses[0]["input"]["unit"] in ("c", "f")
    assert not wrong, f"{len(wrong)} of {len(seeds)} requests: {wrong}"


def test_responses_forced_custom_tool_always_calls(client: TestClient) -> None:
    wrong = {}
    for seed in SEEDS:
        body = responses(
            client, seed, tools=RESPONSES_TOOLS, tool_choice={"type": "custom", "name": "answer"}
        )
        calls = [item for item in body["output"] if item["type"] == "custom_tool_call"]
        messages = [item for item in body["output"] if item["type"] == "message"]
        if len(calls) != 1 or messages or body["status"] != "completed":
            wrong[seed] = body["output"]
        else:
            assert calls[0]["name"] == "answer"
            assert calls[0]["input"] in ("yes", "no")
    assert not wrong, f"{len(wrong)} of {len(SEEDS)} seeds: {wrong}"


SHORT = 60  # max tokens: reasoning left alone, the random model would use them all


def called(api: str, body: dict[str, Any]) -> bool:
    """Whether a response (of `api`) holds a tool call."""
    if api == "chat":
        return bool(body["choices"][0]["message"].get("tool_calls"))
    if api == "messages":
        return any(block["type"] == "tool_use" for block in body["content"])
    return any(item["type"] in ("function_call", "custom_tool_call") for item in body["output"])


def post(client: TestClient, api: str, seed: int, choice: str, max_tokens: int) -> dict[str, Any]:
    """A request with tools and tool choice `choice` ("none", "auto", "forced") in `api`'s
    shape, with no reasoning budget of its own."""
    forced_choice = {
        "chat": {"type": "function", "function": {"name": "get_time"}},
        "messages": {"type": "tool", "name": "get_time"},
        "responses": {"type": "function", "name": "get_weather"},
    }[api]
    wire = forced_choice if choice == "forced" else choice
    if api == "chat":
        request = {"messages": [{"role": "user", "content": user(seed)}], "seed": seed,
                   "tools": CHAT_TOOLS, "tool_choice": wire, "max_tokens": max_tokens}  # fmt: skip
    elif api == "messages":
        wire = {"type": wire} if isinstance(wire, str) else wire
        request = {"messages": [{"role": "user", "content": user(seed)}], "tools": MESSAGES_TOOLS,
                   "tool_choice": wire, "max_tokens": max_tokens}  # fmt: skip
    else:
        request = {"input": user(seed), "seed": seed, "store": False, "tools": RESPONSES_TOOLS,
                   "tool_choice": wire, "max_output_tokens": max_tokens}  # fmt: skip
    path = {"chat": "chat/completions", "messages": "messages", "responses": "responses"}[api]
    response = client.post(f"/v1/{path}", json={"model": MODEL, "temperature": 1.0, **request})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_forced_call_is_written_within_a_short_max_tokens(client: TestClient, api: str) -> None:
    """No reasoning budget, few output tokens: the analysis must end in time for the call (as
    the Vercel AI SDK's generateText with a forced tool needs)."""
    missing = {}
    for seed in SEEDS[:5]:
        body = post(client, api, seed, "forced", SHORT)
        if not called(api, body):
            missing[seed] = body
    assert not missing, f"{len(missing)} of 5 requests without the call: {missing}"


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_none_never_calls_where_auto_does(
    client: TestClient, forced: ForcedScript, api: str
) -> None:
    """After a forced short analysis, the model samples the next header itself: under `auto`
    it calls a tool for some seeds (the control: so the check under `none` can fail), under
    `none` never."""
    calls = {}
    for choice in ("auto", "none"):
        calls[choice] = 0
        for seed in SEEDS:
            forced.push("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant")
            calls[choice] += called(api, post(client, api, seed, choice, 24))
    assert calls["auto"] > 0, calls
    assert calls["none"] == 0, calls
