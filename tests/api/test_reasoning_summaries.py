"""Reasoning summaries on the real tiny engine, both APIs, outputs forced for the answer AND the
summary pass (scripts go to generations in the order the engine admits them: main, summary).

Also the server's visibility policy: with `summary` or `none`, no raw analysis text may appear
anywhere in the HTTP output of either API, streaming or not, while the tool loop still renders
the raw analysis in the next prompt.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseReasoningItem, ResponseReasoningSummaryTextDeltaEvent
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.ops.runtime import Runtime
from tests.support.chat_grammar import check_chat_stream
from tests.support.event_grammar import check_stream
from tests.support.responses import MODEL, create, responses_client, sse_payloads, stream
from tests.support.scripts import reason_then_answer, reason_then_call
from tests.support.sse import parse_sse

RAW = "SECRET-COT-7f3a the user greets; reply briefly."
REASON_THEN_ANSWER = reason_then_answer(RAW, "Hello!")
SUMMARY_TEXT = "**Greeting** The user says hello."
SUMMARY = (
    "<|channel|>analysis<|message|>Summarize.<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{SUMMARY_TEXT}<|return|>"
)
RAW_CALL = "SECRET-COT-91bc need to list the files."
EXEC_CALL = reason_then_call(RAW_CALL, "exec_command", '{"cmd":"ls"}')
CALL_SUMMARY_TEXT = "**Listing** Runs ls."
CALL_SUMMARY = f"<|channel|>final<|message|>{CALL_SUMMARY_TEXT}<|return|>"
ANSWER = "<|channel|>final<|message|>Two files.<|return|>"
EXEC_TOOL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in EXEC_TOOL.items() if k != "type"}}
HI = [{"role": "user", "content": "Hi"}]


class Clients:
    """One app per visibility policy, on the same engine."""

    def __init__(self, raw: TestClient, summary: TestClient, none: TestClient) -> None:
        self.raw, self.summary, self.none = raw, summary, none


@pytest.fixture(scope="module")
def clients(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    with (
        responses_client(runtime, tmp_path_factory.mktemp("raw")) as raw,
        responses_client(
            runtime, tmp_path_factory.mktemp("summary"), reasoning_visibility="summary"
        ) as summary,
        responses_client(
            runtime, tmp_path_factory.mktemp("none"), reasoning_visibility="none"
        ) as none,
    ):
        yield Clients(raw, summary, none)


def decoded(encoding: HarmonyEncoding, prompt: list[int]) -> str:
    return encoding.decode_utf8(prompt)


def main_prompt(encoding: HarmonyEncoding, forced: ForcedScript, marker: str) -> str:
    """The last prompt that holds `marker` (summary prompts come in between)."""
    for prompt in reversed(forced.prompts):
        text = decoded(encoding, prompt)
        if marker in text and "summarize the private reasoning" not in text:
            return text
    raise AssertionError(f"no prompt with {marker!r}")


def chat_stream(client: TestClient, **body: Any) -> tuple[bytes, list[ChatCompletionChunk]]:
    with client.stream(
        "POST", "/v1/chat/completions", json={"model": MODEL, "stream": True, **body}
    ) as response:
        assert response.status_code == 200, response.read()
        raw = response.read()
    datas = [event.data for event in parse_sse(raw.decode().splitlines())]
    check_chat_stream(datas)
    return raw, [ChatCompletionChunk.model_validate_json(d) for d in datas[:-1]]


def responses_stream_raw(client: TestClient, **body: Any) -> bytes:
    with client.stream(
        "POST", "/v1/responses", json={"model": MODEL, "stream": True, **body}
    ) as response:
        assert response.status_code == 200, response.read()
        raw = response.read()
    check_stream(sse_payloads(raw.decode().splitlines()))
    return raw


TEXT_KEYS = {"delta", "text", "reasoning", "reasoning_content", "content", "summary", "arguments"}


def streamed_texts(output: bytes) -> dict[str, str]:
    """The text-carrying values of an HTTP body (JSON or SSE), joined in order per key, so that
    text streamed in pieces is searched as a whole."""
    payloads = [e.data for e in parse_sse(output.decode().splitlines())] or [output.decode()]
    texts: dict[str, str] = {}

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, str) and key in TEXT_KEYS:
            texts[key] = texts.get(key, "") + value
        elif isinstance(value, dict):
            for name, inner in value.items():
                walk(inner, name)
        elif isinstance(value, list):
            for inner in value:
                walk(inner, key)

    for payload in payloads:
        if payload != "[DONE]":
            walk(json.loads(payload))
    return texts


def assert_no_raw_reasoning(output: bytes) -> None:
    assert b"SECRET-COT" not in output
    for key, text in streamed_texts(output).items():
        assert "SECRET-COT" not in text, key
    assert b"reasoning_text" not in output  # no raw content part, delta or done event
    assert b"reasoning.text" not in output


def extra(model: Any, name: str) -> Any:
    return (model.model_extra or {}).get(name)


def deltas(delta: Any, name: str) -> list[Any]:
    return list(extra(delta, name) or [])


# ------------------------------------------------------------------------- Responses


def test_responses_stream_carries_the_summary_inside_the_reasoning_item(
    clients: Clients, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    before = len(forced.prompts)
    checked = stream(
        clients.raw,
        input="Hi",
        instructions="DEVELOPER-SECRET-INSTRUCTIONS",
        reasoning={"effort": "low", "summary": "auto"},
    )
    reasoning, message = checked.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": RAW}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": SUMMARY_TEXT}]
    assert message["content"][0]["text"] == "Hello!"
    types = checked.types()
    assert types.index("response.reasoning_summary_text.delta") < types.index(
        "response.output_item.done"
    )
    response = checked.response
    assert response.reasoning is not None
    assert response.reasoning.summary == "auto"
    usage = checked.terminal["response"]["usage"]
    summary_usage = usage["summary_usage"]
    assert summary_usage["summaries"] == 1
    assert summary_usage["output_tokens"] == len(encoding.encode(SUMMARY, allowed_special="all"))
    assert usage["output_tokens"] == len(encoding.encode(REASON_THEN_ANSWER, allowed_special="all"))
    main, summary = (decoded(encoding, p) for p in forced.prompts[before:])
    assert "DEVELOPER-SECRET-INSTRUCTIONS" in main
    assert "DEVELOPER-SECRET-INSTRUCTIONS" not in summary  # only the analysis is summarized
    assert "Reasoning: low" in summary
    assert f"<|start|>user<|message|>{RAW}<|end|>" in summary


def test_responses_non_stream_is_the_fold_with_the_summary(
    clients: Clients, forced: ForcedScript
) -> None:
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    body = create(clients.raw, input="Hi", reasoning={"summary": "concise"})
    reasoning = body["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": SUMMARY_TEXT}]
    assert body["usage"]["summary_usage"]["summaries"] == 1
    assert body["reasoning"]["summary"] == "concise"


def test_no_summary_unless_asked(clients: Clients, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    before = len(forced.prompts)
    body = create(clients.raw, input="Hi", reasoning={"summary": "none"})
    assert len(forced.prompts) == before + 1  # no summary generation
    assert body["output"][0]["summary"] == []
    assert "summary_usage" not in body["usage"]


def test_the_sdk_stream_helper_accumulates_the_summary(
    clients: Clients, forced: ForcedScript
) -> None:
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    sdk = OpenAI(base_url="http://testserver/v1", api_key="x", http_client=clients.raw)
    with sdk.responses.stream(model=MODEL, input="Hi", reasoning={"summary": "auto"}) as events:
        deltas = [e.delta for e in events if isinstance(e, ResponseReasoningSummaryTextDeltaEvent)]
        final = events.get_final_response()
    assert "".join(deltas) == SUMMARY_TEXT
    reasoning = final.output[0]
    assert isinstance(reasoning, ResponseReasoningItem)
    assert [part.text for part in reasoning.summary] == [SUMMARY_TEXT]
    assert final.output_text == "Hello!"


# ------------------------------------------------------------------------------ Chat


def test_chat_stream_and_fold_carry_the_summary(clients: Clients, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    request = {"messages": HI, "reasoning": {"summary": "auto"}}
    _, chunks = chat_stream(clients.raw, **request, stream_options={"include_usage": True})
    details = [
        d for c in chunks for ch in c.choices for d in extra(ch.delta, "reasoning_details") or []
    ]
    assert {d["type"] for d in details} == {"reasoning.summary"}
    assert {d["index"] for d in details} == {1}  # index 0 is the raw reasoning.text entry
    assert "".join(d["summary"] for d in details) == SUMMARY_TEXT
    assert "".join(extra(ch.delta, "reasoning") or "" for c in chunks for ch in c.choices) == RAW
    usage = chunks[-1].usage
    assert usage is not None
    assert extra(usage, "summary_usage")["summaries"] == 1
    assert extra(chunks[-1], "timings")["summary_n"] == 1
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    response = clients.raw.post("/v1/chat/completions", json={"model": MODEL, **request})
    body = ChatCompletion.model_validate(response.json())
    message = body.choices[0].message
    assert extra(message, "reasoning") == RAW
    assert extra(message, "reasoning_details") == [
        {"type": "reasoning.text", "text": RAW, "format": "unknown", "index": 0},
        {"type": "reasoning.summary", "summary": SUMMARY_TEXT, "format": "unknown", "index": 1},
    ]
    assert body.usage is not None
    assert extra(body.usage, "summary_usage")["completion_tokens"] > 0


# ------------------------------------------------------------------- visibility policy


def test_policy_summary_hides_the_raw_reasoning_everywhere(
    clients: Clients, forced: ForcedScript
) -> None:
    client, outputs = clients.summary, []
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    outputs.append(responses_stream_raw(client, input="Hi"))  # summaries although not asked
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    body = create(client, input="Hi")
    outputs.append(client.get(f"/v1/responses/{body['id']}").content)
    reasoning = body["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": SUMMARY_TEXT}]
    assert reasoning["content"] == []
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    raw, chunks = chat_stream(client, messages=HI)
    outputs.append(raw)
    assert "".join(extra(ch.delta, "reasoning") or "" for c in chunks for ch in c.choices) == (
        SUMMARY_TEXT
    )
    forced.push(REASON_THEN_ANSWER)
    forced.push(SUMMARY)
    response = client.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
    outputs.append(response.content)
    message = response.json()["choices"][0]["message"]
    assert message["reasoning"] == SUMMARY_TEXT  # what chat UIs show as thinking
    assert message["reasoning_details"] == [
        {"type": "reasoning.summary", "summary": SUMMARY_TEXT, "format": "unknown", "index": 0}
    ]
    for output in outputs:
        assert_no_raw_reasoning(output)
        assert any(SUMMARY_TEXT in text for text in streamed_texts(output).values())


def test_policy_none_shows_no_reasoning(clients: Clients, forced: ForcedScript) -> None:
    client, outputs = clients.none, []
    before = len(forced.prompts)
    for _ in range(4):
        forced.push(REASON_THEN_ANSWER)
    outputs.append(responses_stream_raw(client, input="Hi", reasoning={"summary": "auto"}))
    body = create(client, input="Hi", reasoning={"summary": "auto"})
    assert [item["type"] for item in body["output"]] == ["message"]
    outputs.append(chat_stream(client, messages=HI, reasoning={"summary": "auto"})[0])
    response = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": HI, "reasoning": {"summary": "auto"}},
    )
    outputs.append(response.content)
    assert "reasoning" not in response.json()["choices"][0]["message"]
    assert len(forced.prompts) == before + 4  # no summary generations
    for output in outputs:
        assert_no_raw_reasoning(output)
        assert b"reasoning_summary" not in output
        assert b"reasoning.summary" not in output


def test_exclude_still_works_inside_the_summary_policy(
    clients: Clients, forced: ForcedScript
) -> None:
    forced.push(REASON_THEN_ANSWER)
    before = len(forced.prompts)
    response = clients.summary.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": HI, "reasoning": {"exclude": True, "summary": "auto"}},
    )
    message = response.json()["choices"][0]["message"]
    assert message["content"] == "Hello!"
    assert not any(key.startswith("reasoning") for key in message)
    assert len(forced.prompts) == before + 1  # nothing to show: no summary generated


@pytest.mark.parametrize("policy", ["summary", "none"])
def test_policy_tool_loop_keeps_the_raw_analysis_in_the_prompt_responses(
    policy: str, clients: Clients, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    client = clients.summary if policy == "summary" else clients.none
    question = f"List files {uuid.uuid4().hex}"
    forced.push(EXEC_CALL)
    if policy == "summary":
        forced.push(CALL_SUMMARY)
    first = create(client, input=question, tools=[EXEC_TOOL], store=False)
    assert_no_raw_reasoning(json.dumps(first).encode())
    call = first["output"][-1]
    forced.push(ANSWER)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a\nb"}
    replay = [{"role": "user", "content": question}, *first["output"], output]
    second = create(client, input=replay, tools=[EXEC_TOOL])
    assert second["output"][-1]["content"][0]["text"] == "Two files."
    prompt = main_prompt(encoding, forced, question)
    assert f"<|channel|>analysis<|message|>{RAW_CALL}<|end|>" in prompt
    assert prompt.index(RAW_CALL) < prompt.index("to=functions.exec_command")
    # continuing through the store (previous_response_id) renders the raw analysis too
    forced.push(EXEC_CALL)
    if policy == "summary":
        forced.push(CALL_SUMMARY)
    stored = create(client, input=question + " again", tools=[EXEC_TOOL])
    forced.push(ANSWER)
    call_id = stored["output"][-1]["call_id"]
    output = {"type": "function_call_output", "call_id": call_id, "output": "c"}
    create(client, input=[output], tools=[EXEC_TOOL], previous_response_id=stored["id"])
    assert RAW_CALL in main_prompt(encoding, forced, question + " again")


@pytest.mark.parametrize("send_back", ["as received", "without reasoning"])
def test_policy_summary_tool_loop_keeps_the_raw_analysis_in_the_prompt_chat(
    send_back: str, clients: Clients, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    question = f"List files {uuid.uuid4().hex}"
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    forced.push(EXEC_CALL)
    forced.push(CALL_SUMMARY)
    response = clients.summary.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": [CHAT_TOOL]}
    )
    assert_no_raw_reasoning(response.content)
    message = response.json()["choices"][0]["message"]
    assert message["reasoning"] == CALL_SUMMARY_TEXT
    if send_back == "without reasoning":
        message = {k: v for k, v in message.items() if not k.startswith("reasoning")}
    call_id = message["tool_calls"][0]["id"]
    messages += [message, {"role": "tool", "tool_call_id": call_id, "content": "a\nb"}]
    forced.push(ANSWER)
    response = clients.summary.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": [CHAT_TOOL]}
    )
    assert response.json()["choices"][0]["message"]["content"] == "Two files."
    prompt = main_prompt(encoding, forced, question)
    assert f"<|channel|>analysis<|message|>{RAW_CALL}<|end|>" in prompt
    assert CALL_SUMMARY_TEXT not in prompt  # the summary stood in for it only on the wire
