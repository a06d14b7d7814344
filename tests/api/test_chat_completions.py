"""/v1/chat/completions over real HTTP handling on the real tiny engine, outputs forced."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.api.chat.adapter import generation_options, to_transcript
from server.api.chat.emitter import ChatEmitter, ChatEvent
from server.api.chat.schemas import ChatCompletionRequest
from server.app import create_app
from server.contracts.events import Finished, FinishReason
from server.harmony import decoder
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.chat import USER_HI, chunks_of, joined, post, stream
from tests.support.chat_grammar import check_chat_stream
from tests.support.polling import wait_until
from tests.support.scripts import GREETING
from tests.support.tiny_engine import tiny_app

REASON_THEN_ANSWER = GREETING


def test_stream_splits_reasoning_and_answer(client: TestClient, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    chunks = chunks_of(stream(client, messages=USER_HI, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert joined(chunks, "reasoning") == "User greets. Reply briefly."
    assert joined(chunks, "reasoning_content") == "User greets. Reply briefly."
    assert joined(chunks, "content") == "Hello! 👋 How can I help?"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    usage = usage_chunk.usage
    assert usage is not None
    assert usage.completion_tokens_details is not None
    reasoning_tokens = usage.completion_tokens_details.reasoning_tokens or 0
    assert usage.completion_tokens > reasoning_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_non_stream_is_the_fold_of_the_stream(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(REASON_THEN_ANSWER)
    streamed = chunks_of(stream(client, messages=USER_HI))
    forced.push(REASON_THEN_ANSWER)
    response = post(client, messages=USER_HI)
    assert response.status_code == 200
    body = ChatCompletion.model_validate(response.json())
    message = body.choices[0].message
    extra = message.model_extra or {}
    assert message.content == joined(streamed, "content")
    assert extra["reasoning"] == joined(streamed, "reasoning")
    assert extra["reasoning_content"] == extra["reasoning"]
    assert extra["reasoning_details"] == [
        {"type": "reasoning.text", "text": extra["reasoning"], "format": "unknown", "index": 0}
    ]
    assert body.choices[0].finish_reason == "stop"
    script_tokens = encoding.encode(REASON_THEN_ANSWER, allowed_special="all")
    analysis = encoding.encode(
        "<|channel|>analysis<|message|>User greets. Reply briefly.<|end|>", allowed_special="all"
    )
    assert body.usage is not None
    assert body.usage.completion_tokens == len(script_tokens)
    assert body.usage.completion_tokens_details is not None
    assert body.usage.completion_tokens_details.reasoning_tokens == len(analysis)
    assert body.usage.total_tokens == body.usage.prompt_tokens + body.usage.completion_tokens


def test_exclude_hides_reasoning_but_the_model_still_reasons(
    client: TestClient, forced: ForcedScript
) -> None:
    for request in ({"reasoning": {"exclude": True}}, {"include_reasoning": False}):
        forced.push(REASON_THEN_ANSWER)
        datas = stream(client, messages=USER_HI, **request)
        assert "User greets" not in "".join(datas)
        assert joined(chunks_of(datas), "content") == "Hello! 👋 How can I help?"
        forced.push(REASON_THEN_ANSWER)
        body = post(client, messages=USER_HI, **request).json()
        message = body["choices"][0]["message"]
        assert "reasoning" not in message
        assert "reasoning_content" not in message
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_several_analysis_messages_are_one_reasoning_text(
    client: TestClient, forced: ForcedScript
) -> None:
    script = (
        "<|channel|>analysis<|message|>First.<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done.<|return|>"
    )
    forced.push(script)
    streamed = joined(chunks_of(stream(client, messages=USER_HI)), "reasoning")
    forced.push(script)
    folded = post(client, messages=USER_HI).json()["choices"][0]["message"]["reasoning"]
    assert streamed == folded == "First.\nSecond."


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        ({"reasoning": {"effort": "xhigh"}}, "Reasoning: high"),
        ({"reasoning": {"effort": "minimal"}}, "Reasoning: low"),
        ({"reasoning_effort": "low"}, "Reasoning: low"),
        ({"reasoning": {"max_tokens": 10000}}, "Reasoning: high"),
        ({}, "Reasoning: medium"),
    ],
)
def test_reasoning_effort_reaches_the_system_message(
    client: TestClient,
    forced: ForcedScript,
    encoding: HarmonyEncoding,
    request_fields: dict[str, Any],
    expected: str,
) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    assert post(client, messages=USER_HI, **request_fields).status_code == 200
    assert expected in encoding.decode_utf8(forced.prompts[-1])


def test_history_renders_instructions_and_drops_finished_reasoning(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in English."}]},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "OLD-THOUGHT"},
        {"role": "user", "content": "Bye"},
    ]
    forced.push("<|channel|>final<|message|>Bye!<|return|>")
    assert post(client, messages=messages).status_code == 200
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "# Instructions\n\nBe terse.\n\nAnswer in English." in prompt
    assert "OLD-THOUGHT" not in prompt
    assert "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>" in prompt
    assert prompt.endswith("<|start|>user<|message|>Bye<|end|><|start|>assistant")


def test_max_tokens_finishes_with_length(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>one two three four five six seven<|return|>")
    body = post(client, messages=USER_HI, max_tokens=5).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


def test_malformed_model_output_is_not_an_error(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>Hi<|end|>stray text<|return|>")
    response = post(client, messages=USER_HI, max_tokens=50)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hi"
    forced.push("<|channel|>final<|message|>Hi<|end|>stray text<|return|>")
    datas = stream(client, messages=USER_HI, max_tokens=50)
    assert joined(chunks_of(datas), "content") == "Hi"


def test_unknown_fields_are_ignored(client: TestClient, forced: ForcedScript) -> None:
    forced.push("<|channel|>final<|message|>ok<|return|>")
    response = post(client, messages=USER_HI, frobnicate=3, user="u1", metadata={"a": "b"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": USER_HI, "n": 5}, "n"),  # more than the 4 slots
        ({"messages": USER_HI, "temperature": 5}, "temperature"),
        ({"messages": USER_HI, "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
        ),
        (
            {"messages": [*USER_HI, {"role": "tool", "tool_call_id": "nope", "content": "x"}]},
            "messages[1].tool_call_id",
        ),
    ],
)
def test_bad_requests_get_openai_errors(
    client: TestClient, body: dict[str, Any], param: str
) -> None:
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_invalid_json_is_a_400(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_prompt_longer_than_context_is_rejected_before_compute(
    client: TestClient, forced: ForcedScript
) -> None:
    before = len(forced.prompts)
    response = post(client, messages=[{"role": "user", "content": "word " * 5000}])
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert len(forced.prompts) == before  # nothing reached the engine


def test_unknown_route_is_an_openai_404(client: TestClient) -> None:
    response = client.get("/v1/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_health_and_models(client: TestClient) -> None:
    health = client.get("/health").json()
    assert health == {"status": "ok", "model": "gpt-oss-tiny", "model_state": "loaded"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (model,) = models["data"]
    assert model["id"] == "gpt-oss-tiny"
    assert model["context_length"] == 4096
    assert model["meta"]["n_vocab"] == 201088


def test_oversized_bodies_are_refused_before_parsing(runtime: Runtime) -> None:
    app = create_app(Settings(max_request_bytes=2048), runtime)
    with TestClient(app) as small:
        big = {"messages": [{"role": "user", "content": "x" * 4096}]}
        response = small.post("/v1/chat/completions", json=big)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        chunked = small.post(
            "/v1/chat/completions",
            content=iter([b'{"messages": [{"role": "user", "content": "', b"y" * 4096, b'"}]}']),
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 413
        assert small.get("/health").status_code == 200


def test_a_paced_stream_joins_the_tokens_of_an_interval_into_one_delta(
    runtime: Runtime, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    """With a long interval the first token goes out at once (a header token: no delta) and
    the rest when the generation ends: one delta per segment, the same text as per token."""
    app = create_app(Settings(reasoning_effort="medium", stream_interval_ms=1000), runtime)
    with TestClient(app) as paced:
        assert app.state.generator.stream_interval_s == 1.0  # the setting reaches the generator
        # an interval no generation outlasts, however loaded the machine: the end flushes it
        app.state.generator.stream_interval_s = 3600.0
        forced.push(REASON_THEN_ANSWER)
        chunks = chunks_of(stream(paced, messages=USER_HI))
    assert joined(chunks, "reasoning") == "User greets. Reply briefly."
    assert joined(chunks, "content") == "Hello! 👋 How can I help?"
    answer_tokens = len(encoding.encode("Hello! 👋 How can I help?"))
    with_content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    with_reasoning = [c for c in chunks if c.choices and (c.choices[0].delta.model_extra or {})]
    assert answer_tokens > 5
    assert 1 <= len(with_content) < answer_tokens
    assert 1 <= len(with_reasoning) <= 2


def test_a_generation_decodes_with_a_parser_made_before_it(
    client: TestClient, forced: ForcedScript, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making harmony's streaming parser (0.3-0.6 ms in a server) right after the prompt went to
    the engine held the GIL the engine thread needed to start the prefill: a generation takes
    one made earlier, and the stock is made up again once the generation ended."""
    stock = client.app.state.generator.parsers  # type: ignore[attr-defined]
    full = stock.ready
    assert full >= 1
    made: list[object] = []
    made_by_then: list[int] = []
    make = decoder.new_parser

    def counted(encoding: HarmonyEncoding) -> Any:
        made.append(make(encoding))
        return made[-1]

    def watched(*args: Any, **kwargs: Any) -> Any:
        built = decoder.HarmonyDecoder(*args, **kwargs)
        made_by_then.append(len(made))  # parsers made up to the decoder's start
        return built

    monkeypatch.setattr(decoder, "new_parser", counted)
    monkeypatch.setattr("server.core.prepared.HarmonyDecoder", watched)
    forced.push(REASON_THEN_ANSWER)
    assert joined(chunks_of(stream(client, messages=USER_HI)), "content") == (
        "Hello! 👋 How can I help?"
    )
    assert made_by_then == [0]  # the decoder's parser was ready: none made for it
    # the next one, made after the stream's last write (which the client may see first)
    wait_until(lambda: stock.ready == full, timeout=10)
    assert len(made) == 1


def test_the_role_chunk_is_made_once_the_engine_has_the_generation(
    client: TestClient, forced: ForcedScript, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generation goes to the engine before the stream's opening chunk is made, which is
    then made while the prompt is evaluated (Prepared.first.begin)."""
    engine = client.app.state.generator.engine  # type: ignore[attr-defined]
    loads: list[int] = []
    start = ChatEmitter.start

    def watched(self: ChatEmitter) -> list[ChatEvent]:
        load = engine.load
        loads.append(load.running + load.waiting)
        return start(self)

    monkeypatch.setattr(ChatEmitter, "start", watched)
    forced.push(REASON_THEN_ANSWER)
    assert joined(chunks_of(stream(client, messages=USER_HI)), "content") == (
        "Hello! 👋 How can I help?"
    )
    assert loads == [1]


def test_a_generation_that_raises_mid_stream_ends_with_an_error_and_done(
    runtime: Runtime, forced: ForcedScript
) -> None:
    """The generator's `on_finished` hook (the app's metrics) raising is a real failure inside
    the generation: after the answer was streamed, before its `Finished` event. The stream
    still ends as OpenAI's do: the error envelope as a `data:` line, then `[DONE]`."""
    app = tiny_app(runtime)
    with TestClient(app, raise_server_exceptions=False) as failing:

        def observe(finished: Finished) -> None:
            raise RuntimeError("the metrics broke")

        app.state.generator.on_finished = observe
        forced.push("<|channel|>final<|message|>Hello there<|return|>")
        datas = stream(failing, messages=USER_HI)
        assert datas[-1] == "[DONE]"
        error = json.loads(datas[-2])["error"]
        assert error["type"] == "server_error"
        assert "internal error: RuntimeError" in error["message"]
        checked = check_chat_stream(datas)
        assert checked.error == error
        assert checked.content == "Hello there"  # streamed before the failure
        assert checked.finish_reason is None

        forced.push("<|channel|>final<|message|>Hello there<|return|>")
        response = post(failing, messages=USER_HI)
        assert response.status_code == 500
        assert "internal error: RuntimeError" in response.json()["error"]["message"]


def test_a_begun_generation_whose_client_left_is_cancelled_reported_and_let_go(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Prepared.first.begin` submits the first round before the response's events are read; a
    response that ends there (its client left at the opening events) abandons it: the engine
    stops it, the generation is reported as cancelled, and its admission place is free."""
    generator = client.app.state.generator  # type: ignore[attr-defined]
    reports: list[Finished] = []
    monkeypatch.setattr(generator, "on_finished", reports.append)  # the app's is restored
    body = ChatCompletionRequest.model_validate(
        {"model": "gpt-oss-tiny", "messages": USER_HI, "max_tokens": 4000}
    )
    transcript = to_transcript(body, "medium", "2026-01-02")

    async def begin_then_leave() -> None:
        prepared = generator.prepare(transcript, generation_options(body, None))
        assert generator.admission.held == 1
        await prepared.first.begin()
        prepared.first.abandon()
        assert generator.admission.held == 0  # at once, not when `prepared` is collected
        while not reports:  # the report comes once the engine lets go of the generation
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(begin_then_leave(), 60))
    assert [report.reason for report in reports] == [FinishReason.CANCELLED]
    assert reports[0].usage.completion_tokens < 4000
    assert generator.engine.load.running == 0
