"""Structured output on the real tiny engine: the final answer holds to its JSON schema.

`response_format` (chat) and `text.format` (responses) go through the same converter as tool
arguments (server.grammars), so integer bounds, string lengths and strings without raw control
characters hold for the final answer as they do for tool calls. Random weights are the
adversary: the reasoning and the final header are forced, the answer is sampled for real at
temperature 1, a different seed per request, over both APIs, streamed and not.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from tests.support.chat import USER_HI, chunks_of, joined, post, stream
from tests.support.responses import create
from tests.support.responses import stream as responses_stream

SEEDS = range(40, 48)  # each API, streamed and not, twice
TO_FINAL = "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "digit": {"type": "integer", "minimum": 1, "maximum": 9},
        "offset": {"type": "integer", "exclusiveMinimum": -3, "maximum": 250},
        "word": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["digit", "offset", "word", "tags"],
    "additionalProperties": False,
}


def _chat_answer(client: TestClient, seed: int, streamed: bool) -> tuple[str, bool]:
    body: dict[str, Any] = {
        "messages": USER_HI,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": SCHEMA, "strict": True},
        },
        "max_tokens": 300,
        "temperature": 1.0,
        "seed": seed,
    }
    if streamed:
        chunks = chunks_of(stream(client, **body))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        return joined(chunks, "content"), finish[-1] == "stop"
    response = post(client, **body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"] == "stop"


def _responses_answer(client: TestClient, seed: int, streamed: bool) -> tuple[str, bool]:
    body: dict[str, Any] = {
        "input": "Hi",
        "text": {"format": {"type": "json_schema", "name": "out", "schema": SCHEMA}},
        "max_output_tokens": 300,
        "temperature": 1.0,
        "seed": seed,
        "store": False,
    }
    response = responses_stream(client, **body).terminal["response"] if streamed else None
    response = response or create(client, **body)
    messages = [item for item in response["output"] if item["type"] == "message"]
    text = "".join(part["text"] for item in messages for part in item["content"])
    return text, response["status"] == "completed"


def test_final_answers_validate_against_the_schema(
    client: TestClient, forced: ForcedScript
) -> None:
    answers = []
    for i, seed in enumerate(SEEDS):
        forced.push(TO_FINAL)
        sample = _chat_answer if i % 2 == 0 else _responses_answer
        text, complete = sample(client, seed, streamed=(i // 2) % 2 == 0)
        assert complete, text
        answer = json.loads(text)  # strict: a raw control character in a string fails here
        jsonschema.validate(answer, SCHEMA)
        answers.append(answer)
    assert forced.pending == 0
    assert len({json.dumps(a, sort_keys=True) for a in answers}) > 1  # sampled, not scripted


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": USER_HI,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
                },
            },
            "response_format",
        ),
        (
            "/v1/responses",
            {
                "input": "Hi",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "object"},
                        "strict": True,
                    }
                },
            },
            "text.format",
        ),
    ],
)
def test_strict_schemas_the_converter_cannot_enforce_are_refused(
    client: TestClient, path: str, body: dict[str, Any], param: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"ids": {"type": "array", "uniqueItems": True}},
        "required": ["ids"],
    }
    fmt = body.get("response_format") or body["text"]["format"]
    (fmt.get("json_schema") or fmt)["schema"] = schema
    response = client.post(path, json={"model": "gpt-oss-tiny", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert "#/properties/ids" in error["message"]
    assert "uniqueItems" in error["message"]


def test_non_strict_schemas_enforce_what_they_can(client: TestClient, forced: ForcedScript) -> None:
    schema = {
        "type": "object",
        "properties": {
            "digit": {"type": "integer", "minimum": 1, "maximum": 9},
            "ids": {"type": "array", "uniqueItems": True},  # not enforced: any JSON value
        },
        "required": ["digit", "ids"],
        "additionalProperties": False,
    }
    # Sampled at temperature 1: a seed's reply may close the object or still be inside `ids` at
    # the limit, as the numerics fall — and they fall with the KV cache's state (a prefix reused
    # from earlier tests, or restored from the disk cache, is evaluated in other batches), so
    # which seeds close it differs between runs. Seeds are tried until both were seen (40 at
    # most; a dozen missed once in a run), so the closed object's keys are checked on every run.
    ends: dict[int, str] = {}
    for seed in range(40):
        forced.push(TO_FINAL)
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        response = post(
            client,
            messages=USER_HI,
            response_format=fmt,
            max_tokens=400,
            temperature=1.0,
            seed=seed,
        )
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        text = choice["message"]["content"]
        assert re.match(r'\{"digit":[1-9],"ids":', text), text  # also if cut at the limit
        ends[seed] = choice["finish_reason"]
        if choice["finish_reason"] == "stop":
            assert set(json.loads(text)) == {"digit", "ids"}, text
        if {"stop", "length"} <= set(ends.values()):
            break
    assert forced.pending == 0
    assert "stop" in ends.values(), f"no seed closed the object: {ends}"


def test_a_schema_nested_too_deeply_is_a_400_not_a_500(client: TestClient) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}
    response = post(client, messages=USER_HI, response_format=fmt)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format"
    assert "nested too deeply" in response.json()["error"]["message"]
