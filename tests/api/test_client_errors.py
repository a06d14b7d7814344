"""The errors clients act on, worded and typed as each API's own service words them.

Claude Code compacts (or stops with "Prompt is too long") only on Anthropic's exact wording of
a context overflow; OpenAI-API clients (Codex, pi, Cline) match OpenAI's ("maximum context
length", code `context_length_exceeded`). A full queue is a rate limit with Retry-After, a bad
key an authentication error, in both APIs' envelopes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types.shared import ErrorResponse
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.api.messages.errors import anthropic_envelope
from server.app import create_app
from server.core.admission import Ticket
from server.core.generation import Generator
from server.ops.runtime import Runtime
from server.ops.settings import Settings

KEY = "test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
LONG = " ".join(["word"] * 5000)  # more tokens than the test context
# What Claude Code 2.1.332 matches to recognise a context overflow (whole message) and to
# read the numbers it compacts by.
CLAUDE_CODE_PROMPT_TOO_LONG = re.compile(r"^prompt is too long: \d+ tokens > \d+ maximum$")
CLAUDE_CODE_NUMBERS = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)


@pytest.fixture(scope="module")
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(api_key=KEY), runtime)) as test_client:
        yield test_client


def anthropic_error(response: Any, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    ErrorResponse.model_validate(body)
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type, body
    message: str = body["error"]["message"]
    return message


def test_a_prompt_too_long_for_messages_is_worded_as_anthropic_words_it(
    client: TestClient, forced: ForcedScript, runtime: Runtime
) -> None:
    before = len(forced.prompts)
    count = client.post(
        "/v1/messages/count_tokens",
        headers=AUTH,
        json={"model": "m", "messages": [{"role": "user", "content": LONG}]},
    )
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": LONG}]}
    for stream in (False, True):
        response = client.post("/v1/messages", headers=AUTH, json={**body, "stream": stream})
        message = anthropic_error(response, 400, "invalid_request_error")
        assert CLAUDE_CODE_PROMPT_TOO_LONG.match(message), message
        numbers = CLAUDE_CODE_NUMBERS.search(message)
        assert numbers is not None
        assert int(numbers[1]) == count.json()["input_tokens"]
        assert int(numbers[2]) == runtime.engine.info.n_ctx
    assert len(forced.prompts) == before  # refused before any compute


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
        ("/v1/responses", {"input": LONG}, "input"),
        ("/v1/completions", {"prompt": LONG}, "prompt"),
    ],
)
def test_a_prompt_too_long_for_openai_apis_is_worded_as_openai_words_it(
    client: TestClient, runtime: Runtime, path: str, body: dict[str, object], param: str
) -> None:
    response = client.post(path, headers=AUTH, json={"model": "m", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    n_ctx = runtime.engine.info.n_ctx
    assert error["message"].startswith(f"This model's maximum context length is {n_ctx} tokens.")
    assert "maximum context length" in error["message"]  # what OpenAI-API clients look for
    assert error["param"] == param


def test_a_bad_key_is_an_authentication_error_in_each_api(client: TestClient) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    bad = {"authorization": "Bearer wrong"}
    message = anthropic_error(
        client.post("/v1/messages", headers=bad, json=body), 401, "authentication_error"
    )
    assert "API key" in message
    response = client.post("/v1/chat/completions", headers=bad, json=body)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.fixture
def full_queue(client: TestClient) -> Iterator[None]:
    """Every place in the server's admission taken, as by as many requests in flight."""
    generator: Generator = client.app.state.generator  # type: ignore[attr-defined]
    tickets: list[Ticket] = []
    while (ticket := generator.admission.try_acquire()) is not None:
        tickets.append(ticket)
    try:
        yield
    finally:
        for ticket in tickets:
            ticket.release()


def test_a_full_queue_is_a_rate_limit_with_retry_after_in_each_api(
    client: TestClient, full_queue: None, forced: ForcedScript
) -> None:
    before = len(forced.prompts)
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    response = client.post("/v1/messages", headers=AUTH, json=body)
    anthropic_error(response, 429, "rate_limit_error")
    assert int(response.headers["retry-after"]) > 0
    response = client.post("/v1/chat/completions", headers=AUTH, json=body)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(response.headers["retry-after"]) > 0
    # Codex reads the wait from the message's "try again in Ns"
    assert re.search(r"try again in \d+(\.\d+)?s", response.json()["error"]["message"])
    assert len(forced.prompts) == before


def test_the_queue_serves_again_once_places_free(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>Served.<|return|>")
    body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}
    response = client.post("/v1/messages", headers=AUTH, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "Served."}]


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(503, "overloaded_error"), (529, "overloaded_error"), (504, "timeout_error")],
)
def test_unavailable_is_anthropics_overloaded(status: int, error_type: str) -> None:
    """A server that cannot generate now says so as Anthropic does: clients back off and retry."""
    body = anthropic_envelope(status, "The server cannot generate: a host left")
    ErrorResponse.model_validate(body)
    assert body["error"]["type"] == error_type
