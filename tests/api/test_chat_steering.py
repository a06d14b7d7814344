"""Sampling rules on the real engine: tool_choice, reasoning budgets, JSON output, stop strings.

Where a rule is enforced by steering, the model samples for real (random tiny weights) after a
short forced prefix, so the test shows the rule holding, not a script obeying it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.chat import USER_HI, chunks_of, joined, post, stream
from tests.support.metrics import metric
from tests.support.scripts import GREETING as REASON_THEN_ANSWER

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in ("get_weather", "get_time")
]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["answer", "unit"],
    "additionalProperties": False,
}


SEEDS = 8


def test_json_schema_constrains_only_the_final_answer(
    client: TestClient, forced: ForcedScript
) -> None:
    # the reasoning and the final header are scripted; the answer is sampled under the grammar
    forced.push(
        "<|channel|>analysis<|message|>Think freely {not json.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>"
    )
    response_format = {"type": "json_schema", "json_schema": {"name": "temp", "schema": SCHEMA}}
    chunks = chunks_of(
        stream(
            client,
            messages=USER_HI,
            response_format=response_format,
            max_tokens=300,
            temperature=1.0,
            seed=11,
        )
    )
    assert joined(chunks, "reasoning") == "Think freely {not json."
    answer = json.loads(joined(chunks, "content"))
    assert set(answer) == {"answer", "unit"}
    assert isinstance(answer["answer"], int)
    assert answer["unit"] in ("celsius", "fahrenheit")
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]


def test_json_object_mode(client: TestClient, forced: ForcedScript) -> None:
    """Over several seeds the final answer is one JSON object: every finished one parses to a
    dict, and the random model finishes enough of them for that to be tested (it may still be
    inside an object at the limit: such an answer is an object's beginning)."""
    finished = 0
    for seed in range(SEEDS):
        forced.push(
            "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>"
        )
        body = post(
            client,
            messages=USER_HI,
            response_format={"type": "json_object"},
            max_tokens=400,
            temperature=1.0,
            seed=seed,
        ).json()
        choice = body["choices"][0]
        content = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(content), dict)
            finished += 1
        else:
            assert choice["finish_reason"] == "length"
            assert content.startswith("{")
    print(f"json_object: {finished} of {SEEDS} finished")
    assert finished >= SEEDS // 4


def test_named_tool_choice_forces_that_call(client: TestClient, forced: ForcedScript) -> None:
    # no script: the random model samples; the budget of 1 ends any analysis at once, and no
    # preamble may follow it: every generation calls get_time (tests/api/test_forced_tool_choice.py
    # checks the same over more seeds and all three APIs)
    for seed in range(5, 10):
        body = post(
            client,
            messages=USER_HI,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            reasoning={"max_tokens": 1},
            max_tokens=40,
            seed=seed,
        ).json()
        choice = body["choices"][0]
        calls = choice["message"].get("tool_calls")
        assert calls is not None, (seed, choice)
        assert choice["finish_reason"] in ("tool_calls", "length")  # the arguments may run long
        assert [c["function"]["name"] for c in calls] == ["get_time"]
        assert calls[0]["id"].startswith("call_")


def test_tool_choice_none_forbids_calls(client: TestClient, forced: ForcedScript) -> None:
    body = post(
        client,
        messages=USER_HI,
        tools=TOOLS,
        tool_choice="none",
        reasoning={"max_tokens": 1},
        max_tokens=20,
        seed=6,
    ).json()
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message
    assert message["content"]


def test_reasoning_budget_ends_the_analysis(client: TestClient, forced: ForcedScript) -> None:
    # three analysis tokens are allowed; the forced header then turns the rest into the answer
    forced.push("<|channel|>analysis<|message|>alpha beta gamma The answer.<|return|>")
    body = post(client, messages=USER_HI, reasoning={"max_tokens": 3}).json()
    message = body["choices"][0]["message"]
    assert message["reasoning"] == "alpha beta gamma"
    assert message["content"] == " The answer."
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


@pytest.mark.parametrize("streaming", [False, True])
def test_stop_strings_end_the_answer(
    client: TestClient, forced: ForcedScript, streaming: bool
) -> None:
    forced.push(
        "<|channel|>analysis<|message|>Say it. END is fine here.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello world. The END of it.<|return|>"
    )
    request = {"messages": USER_HI, "stop": ["END", "never"]}
    if streaming:
        chunks = chunks_of(stream(client, **request))
        content = joined(chunks, "content")
        reasoning = joined(chunks, "reasoning")
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = post(client, **request).json()["choices"][0]
        content, reasoning = choice["message"]["content"], choice["message"]["reasoning"]
        finish = choice["finish_reason"]
    assert content == "Hello world. The "
    assert reasoning == "Say it. END is fine here."  # stop strings apply to the answer only
    assert finish == "stop"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        ({"reasoning": {"max_tokens": 0}}, "reasoning.max_tokens"),
    ],
)
def test_invalid_tool_and_format_requests(
    client: TestClient, fields: dict[str, Any], param: str
) -> None:
    response = post(client, messages=USER_HI, **fields)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_api_key_is_required_when_configured(runtime: Runtime, forced: ForcedScript) -> None:
    app = create_app(Settings(api_key="s3cret"), runtime)
    with TestClient(app) as secured:
        assert secured.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = secured.post(
                "/v1/chat/completions", json={"messages": USER_HI}, headers=headers
            )
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
        assert secured.get("/v1/models").status_code == 401
        forced.push("<|channel|>final<|message|>ok<|return|>")
        ok = secured.post(
            "/v1/chat/completions",
            json={"messages": USER_HI},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200


def test_tool_names_that_are_not_identifiers(
    client: TestClient, forced: ForcedScript, encoding: Any
) -> None:
    tools = [{"type": "function", "function": {"name": "web.search-v2", "parameters": {}}}]
    forced.push(
        "<|channel|>commentary to=functions.web_search_v2 <|constrain|>json"
        '<|message|>{"q":"otters"}<|call|>'
    )
    body = post(client, messages=USER_HI, tools=tools).json()
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "web.search-v2"
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "type web_search_v2 = " in prompt
    assert "web.search-v2" not in prompt
    # the call comes back in the next request under the client's name
    forced.push("<|channel|>final<|message|>Done.<|return|>")
    messages = [
        *USER_HI,
        body["choices"][0]["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "otters!"},
    ]
    assert post(client, messages=messages, tools=tools).status_code == 200
    assert "<|start|>functions.web_search_v2 to=assistant" in encoding.decode_utf8(
        forced.prompts[-1]
    )


def test_metrics_count_where_steering_overrode_the_model(
    client: TestClient, forced: ForcedScript
) -> None:
    choices = metric(client, "gpt_oss_steering_choices_total")
    overrides = metric(client, "gpt_oss_steering_overrides_total")
    forced.push(REASON_THEN_ANSWER)
    assert post(client, messages=USER_HI).status_code == 200
    # the header tokens picked among allowed sets: analysis, final (a script replaces the
    # picks, the logits are still the model's); the others follow from the prompt or the token
    # before (the first <|channel|>; <|message|>; <|start|> assistant <|channel|> after
    # <|end|>) and are emitted with it, never sampled; random weights almost never favour an
    # allowed token
    assert metric(client, "gpt_oss_steering_choices_total") - choices == 2
    added = metric(client, "gpt_oss_steering_overrides_total") - overrides
    assert 1 <= added <= 2
