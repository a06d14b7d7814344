"""When the model leaves the harmony grammar: a clean end, a log line without its text, a count.

Forced scripts make the real engine write what steering would never allow (text after `<|end|>`,
chain of thought in a header, a call to a tool nobody offered). Each response, streaming or not,
in both APIs, ends with what was parsed (terminal event or finish chunk, usage); /metrics counts
the incident; and no log record, at DEBUG level, holds the chain of thought.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.chat_grammar import ChatStream, check_chat_body, check_chat_stream
from tests.support.responses import MODEL, create, responses_client, stream
from tests.support.sse import parse_sse

SECRET = "SECRET-COT"  # every script's chain of thought contains it
MALFORMED = {
    # text where `<|start|>` must follow `<|end|>`: the parser gives up after the analysis
    "text-after-end": (
        f"<|channel|>analysis<|message|>{SECRET} one.<|end|>stray {SECRET} text<|return|>"
    ),
    # chain of thought written into the next header (harmony quotes it in its error)
    "cot-in-header": (
        f"<|channel|>analysis<|message|>{SECRET} two.<|end|>"
        f"<|start|>assistant {SECRET} keeps thinking<|channel|>final<|message|>Hi<|return|>"
    ),
    # a well-formed call to a tool the request did not offer: steering would not allow it
    "unoffered-tool": (
        f"<|channel|>analysis<|message|>{SECRET} three.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.nope <|constrain|>json"
        '<|message|>{"x":1}<|call|>'
    ),
}
EXPECTED_FINISH = {
    "text-after-end": "stop",
    "cot-in-header": "stop",
    "unoffered-tool": "tool_calls",
}
WELL_FORMED = (
    f"<|channel|>analysis<|message|>{SECRET} fine.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Fine.<|return|>"
)


@pytest.fixture(scope="module")
def client(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with responses_client(runtime, tmp_path_factory.mktemp("store")) as test_client:
        yield test_client


def malformed_count(client: TestClient) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("gpt_oss_malformed_outputs_total "):
            return float(line.split()[-1])
    raise AssertionError("gpt_oss_malformed_outputs_total is not in /metrics")


def user(text: str = "Hi") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{text} {uuid.uuid4().hex}"}]


def chat_stream(client: TestClient, **body: Any) -> ChatStream:
    request = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}, **body}
    with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        payloads = [event.data for event in parse_sse(response.iter_lines())]
    return check_chat_stream(payloads)


def chat_create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    check_chat_body(data)
    return data


@pytest.mark.parametrize("name", list(MALFORMED))
def test_chat_ends_cleanly_and_counts_the_incident(
    client: TestClient, forced: ForcedScript, name: str
) -> None:
    before = malformed_count(client)
    forced.push(MALFORMED[name])
    streamed = chat_stream(client, messages=user())
    assert streamed.finish_reason == EXPECTED_FINISH[name]
    assert streamed.usage is not None
    assert streamed.usage["completion_tokens"] > 0
    assert streamed.reasoning.startswith(SECRET)  # what parsed before the model left the grammar
    forced.push(MALFORMED[name])
    body = chat_create(client, messages=user())
    (choice,) = body["choices"]
    assert choice["finish_reason"] == EXPECTED_FINISH[name]
    assert choice["message"]["reasoning"] == streamed.reasoning
    assert body["usage"]["completion_tokens"] > 0
    if name == "unoffered-tool":
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["nope"]
    assert malformed_count(client) == before + 2


@pytest.mark.parametrize("name", list(MALFORMED))
def test_responses_end_cleanly_and_count_the_incident(
    client: TestClient, forced: ForcedScript, name: str
) -> None:
    before = malformed_count(client)
    forced.push(MALFORMED[name])
    checked = stream(client, input=user())
    assert checked.types()[-1] == "response.completed"
    usage = checked.terminal["response"]["usage"]
    assert usage["output_tokens"] > 0
    reasoning = checked.items[0]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"][0]["text"].startswith(SECRET)
    forced.push(MALFORMED[name])
    body = create(client, input=user())
    assert body["status"] == "completed"
    assert [item["type"] for item in body["output"]] == [item["type"] for item in checked.items]
    assert body["usage"]["output_tokens"] > 0
    assert client.get(f"/v1/responses/{body['id']}").json()["output"] == body["output"]
    assert malformed_count(client) == before + 2


def test_well_formed_output_is_not_counted(client: TestClient, forced: ForcedScript) -> None:
    before = malformed_count(client)
    forced.push(WELL_FORMED)
    assert chat_create(client, messages=user())["choices"][0]["message"]["content"] == "Fine."
    assert malformed_count(client) == before


def test_chain_of_thought_never_reaches_the_logs(
    runtime: Runtime, forced: ForcedScript, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """At DEBUG level (llama_cpp's logger too), across both APIs, streaming and not, a tool
    round whose next prompt replays the reasoning, and every malformed script."""
    call = (
        f"<|channel|>analysis<|message|>{SECRET} call.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd":"ls"}<|call|>'
    )
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    records = _log_everything(runtime, forced, tmp_path_factory, call, tools)
    assert records, "nothing was logged: the check would prove nothing"
    for record in records:
        text = record.getMessage() + (record.exc_text or "") + str(record.exc_info or "")
        assert SECRET not in text, f"{record.name}: {text}"
    assert any("left the harmony" in record.getMessage() for record in records)


def _log_everything(
    runtime: Runtime,
    forced: ForcedScript,
    tmp_path_factory: pytest.TempPathFactory,
    call: str,
    tools: list[dict[str, Any]],
) -> list[logging.LogRecord]:
    handler = _Collect()
    root, llama = logging.getLogger(), logging.getLogger("llama_cpp")
    levels = root.level, llama.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    llama.setLevel(logging.DEBUG)
    try:
        with responses_client(runtime, tmp_path_factory.mktemp("logs")) as client:
            scripts = (WELL_FORMED, *MALFORMED.values())
            calls: list[Callable[[], object]] = [
                lambda: chat_stream(client, messages=user()),
                lambda: chat_create(client, messages=user()),
                lambda: stream(client, input=user()),
                lambda: create(client, input=user()),
            ]
            # every script through both APIs, every API streaming and not
            for script, send in zip(scripts * 2, itertools.cycle(calls)):
                forced.push(script)
                send()
            forced.push(call)
            first = create(client, input=user("List files"), tools=tools)
            call_id = first["output"][-1]["call_id"]
            forced.push("<|channel|>final<|message|>Two files.<|return|>")
            output = {"type": "function_call_output", "call_id": call_id, "output": "a b"}
            create(client, previous_response_id=first["id"], input=[output], tools=tools)
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        llama.setLevel(levels[1])
    return handler.records


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
