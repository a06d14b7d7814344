"""The shared stream run with the chat and messages emitters: every stream ends with its API's
terminal, also when the generation raises or ends without a `Finished` event; a cancelled chat
or completion stream just stops; a completion stream that raises ends with an error and [DONE].
(The Responses emitter's run: tests/unit/api/responses/test_streaming.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from server.api.chat.emitter import ChatEmitter, ChatEvent, ChunkFactory, encode, fold
from server.api.completions.emitter import CompletionEvent, CompletionsEmitter, Identity
from server.api.completions.emitter import encode as encode_completion
from server.api.messages.emitter import MessagesEmitter
from server.api.messages.emitter import fold as fold_message
from server.api.messages.schemas import ErrorEvent, MessageStop
from server.api.messages.schemas import StreamEvent as MessageEvent
from server.api.messages.signature import ThinkingSigner
from server.api.stream_run import Ended, StreamRun
from server.contracts.errors import ServerError
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
)
from server.harmony.token_bytes import TokenBytes
from tests.support.chat_grammar import check_chat_stream
from tests.support.generation import Generation
from tests.support.sse import parse_sse

ANSWER: list[GenerationEvent] = [
    SegmentStart(0, SegmentKind.FINAL, "final"),
    SegmentDelta(0, SegmentKind.FINAL, "Hi"),
    SegmentDelta(0, SegmentKind.FINAL, " there"),
    SegmentEnd(0, SegmentKind.FINAL, "Hi there", (1, 2, 3)),
]


def run_all(run: StreamRun[Any]) -> list[Any]:
    async def collect() -> list[Any]:
        return [event async for event in run.events()]

    return asyncio.run(collect())


def chat_emitter() -> ChatEmitter:
    factory = ChunkFactory("chatcmpl-1", 1, "gpt-oss-tiny")
    return ChatEmitter(factory, include_reasoning=True, include_usage=True)


def chat_payloads(events: list[ChatEvent]) -> list[str]:
    raw = b"".join(encode(event) for event in events).decode()
    return [event.data for event in parse_sse(raw.splitlines())]


def test_a_chat_stream_ends_with_the_finish_usage_and_done() -> None:
    emitter = chat_emitter()
    events = run_all(
        StreamRun(Generation([*ANSWER, Finished(FinishReason.STOP)]), emitter, name="c")
    )
    streamed = check_chat_stream(chat_payloads(events))
    assert (streamed.content, streamed.finish_reason) == ("Hi there", "stop")
    assert streamed.usage is not None
    assert fold(events, emitter)["choices"][0]["message"]["content"] == "Hi there"


def test_a_chat_generation_that_raises_ends_with_an_error_then_done() -> None:
    emitter = chat_emitter()
    events = run_all(StreamRun(Generation(ANSWER[:2], RuntimeError("bug")), emitter, name="c"))
    payloads = chat_payloads(events)
    assert payloads[-1] == "[DONE]"
    streamed = check_chat_stream(payloads)
    assert streamed.error is not None
    assert streamed.error["message"] == "generation failed: internal error: RuntimeError"
    assert streamed.error["type"] == "server_error"
    assert streamed.content == "Hi"
    with pytest.raises(ServerError, match="internal error: RuntimeError"):
        fold(events, emitter)  # the non-streaming answer: the same failure, as an error


def test_a_chat_generation_without_a_finished_event_still_ends() -> None:
    events = run_all(StreamRun(Generation(ANSWER), chat_emitter(), name="c"))
    streamed = check_chat_stream(chat_payloads(events))
    assert streamed.error is not None
    assert "ended without a result" in streamed.error["message"]


def test_a_cancelled_chat_stream_just_stops() -> None:
    generation = Generation([*ANSWER, Finished(FinishReason.CANCELLED)])
    events = run_all(StreamRun(generation, chat_emitter(), name="c"))
    payloads = chat_payloads(events)
    check_chat_stream(payloads, cancelled=True)
    assert "[DONE]" not in payloads
    assert all("error" not in payload for payload in payloads)


def messages_emitter() -> MessagesEmitter:
    return MessagesEmitter(
        "msg_1", "m", input_tokens=10, signer=ThinkingSigner(b"k" * 32), message_start=(1, 2)
    )


def test_a_message_generation_that_raises_ends_with_an_error_event() -> None:
    emitter = messages_emitter()
    run: StreamRun[MessageEvent] = StreamRun(
        Generation(ANSWER[:2], RuntimeError("bug")), emitter, name="message msg_1"
    )
    events = run_all(run)
    assert [event.type for event in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "error",
    ]
    assert isinstance(events[-1], ErrorEvent)
    assert "internal error: RuntimeError" in events[-1].error.message
    with pytest.raises(ServerError, match="RuntimeError"):
        fold_message(events)


def test_the_finish_callback_sees_the_last_events_once() -> None:
    seen: list[tuple[list[str], int]] = []

    async def finish(last: list[MessageEvent], ended: list[Ended]) -> None:
        seen.append(([event.type for event in last], len(ended)))

    emitter = messages_emitter()
    generation = Generation([*ANSWER, Finished(FinishReason.STOP)])
    events = run_all(StreamRun(generation, emitter, name="message msg_1", finish=finish))
    assert isinstance(events[-1], MessageStop)
    assert seen == [(["message_delta", "message_stop"], 1)]


def completions_emitter(encoding: HarmonyEncoding) -> CompletionsEmitter:
    identity = Identity("cmpl-1", 1, "gpt-oss-tiny")
    return CompletionsEmitter(identity, 0, TokenBytes.load(encoding), 3, include_usage=True)


def completion_payloads(events: list[CompletionEvent]) -> list[str]:
    raw = b"".join(encode_completion(event) for event in events).decode()
    return [event.data for event in parse_sse(raw.splitlines())]


def test_a_completion_stream_ends_with_the_finish_usage_and_done(
    encoding: HarmonyEncoding,
) -> None:
    generation = Generation([*ANSWER, Finished(FinishReason.STOP)])
    payloads = completion_payloads(
        run_all(StreamRun(generation, completions_emitter(encoding), name="c"))
    )
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Hi there"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["prompt_tokens"] == 3


def test_a_completion_generation_that_raises_ends_with_an_error_then_done(
    encoding: HarmonyEncoding,
) -> None:
    generation = Generation(ANSWER[:2], RuntimeError("bug"))
    payloads = completion_payloads(
        run_all(StreamRun(generation, completions_emitter(encoding), name="c"))
    )
    assert payloads[-1] == "[DONE]"
    assert json.loads(payloads[0])["choices"][0]["text"] == "Hi"
    error = json.loads(payloads[-2])["error"]
    assert error["message"] == "generation failed: internal error: RuntimeError"
    assert error["type"] == "server_error"


def test_a_cancelled_completion_stream_just_stops(encoding: HarmonyEncoding) -> None:
    generation = Generation([*ANSWER, Finished(FinishReason.CANCELLED)])
    payloads = completion_payloads(
        run_all(StreamRun(generation, completions_emitter(encoding), name="c"))
    )
    assert [json.loads(p)["choices"][0]["text"] for p in payloads] == ["Hi", " there"]
    assert "[DONE]" not in payloads
    assert all("error" not in payload for payload in payloads)


class Beginning(Generation):
    """A scripted generation that can begin before its events are read (Prepared.first)."""

    def __init__(
        self, events: list[GenerationEvent], log: list[str], fail_to_begin: bool = False
    ) -> None:
        super().__init__(events)
        self.log = log
        self.fail_to_begin = fail_to_begin
        self.first = self  # its first round: begin, abandon

    async def begin(self) -> None:
        self.log.append("begin")
        if self.fail_to_begin:
            raise RuntimeError("the engine is closed")

    def abandon(self) -> None:
        self.log.append("abandon")

    async def events(self) -> Any:
        self.log.append("read")
        async for event in super().events():
            yield event


class LoggedStart(ChatEmitter):
    def __init__(self, log: list[str]) -> None:
        super().__init__(ChunkFactory("chatcmpl-1", 1, "m"), include_reasoning=True)
        self.log = log

    def start(self) -> list[ChatEvent]:
        self.log.append("opening")
        return super().start()


def test_a_source_that_can_begin_is_submitted_before_the_opening_events() -> None:
    log: list[str] = []
    source = Beginning([*ANSWER, Finished(FinishReason.STOP)], log)
    events = run_all(StreamRun(source, LoggedStart(log), name="c"))
    assert log == ["begin", "opening", "read"]
    assert check_chat_stream(chat_payloads(events)).content == "Hi there"


def test_a_begun_source_whose_events_are_never_read_is_abandoned() -> None:
    """The client left at the opening events: the submitted generation is cancelled."""

    async def leave_after_the_first_event() -> None:
        events = StreamRun(source, LoggedStart(log), name="c").events()
        await events.__anext__()
        await events.aclose()

    log: list[str] = []
    source = Beginning(ANSWER, log)
    asyncio.run(leave_after_the_first_event())
    assert log == ["begin", "opening", "abandon"]


def test_a_source_that_fails_to_begin_still_opens_and_reads_its_events() -> None:
    """Its events submit it again (and end with the error where it fails again): the response
    is the same as without the early start."""
    log: list[str] = []
    source = Beginning([*ANSWER, Finished(FinishReason.STOP)], log, fail_to_begin=True)
    events = run_all(StreamRun(source, LoggedStart(log), name="c"))
    assert log == ["begin", "opening", "read"]
    assert check_chat_stream(chat_payloads(events)).content == "Hi there"


def call_response(response: Any, sent: list[dict[str, Any]], refuse: bool) -> None:
    """Run an ASGI response; `refuse`: the client is gone before the headers could go out."""

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # the client sends nothing more
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if refuse:
            raise OSError("the client is gone")
        sent.append(message)

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "headers": []}
    with contextlib.suppress(Exception):
        asyncio.run(response(scope, receive, send))


def test_a_streamed_response_is_made_once_its_source_began() -> None:
    """`stream` submits the source before the response exists (its headers and opening events
    are then made while the engine evaluates the prompt); its events take the round over, and
    the response's end lets nothing more go (abandon is a no-op for a round taken over)."""
    log: list[str] = []
    source = Beginning([*ANSWER, Finished(FinishReason.STOP)], log)
    run = StreamRun(source, LoggedStart(log), name="c")
    response = asyncio.run(run.stream(encode, keepalive_s=None))
    assert log == ["begin"]
    sent: list[dict[str, Any]] = []
    call_response(response, sent, refuse=False)
    assert log == ["begin", "begin", "opening", "read", "abandon"]
    body = b"".join(message.get("body", b"") for message in sent).decode()
    payloads = [event.data for event in parse_sse(body.splitlines())]
    assert check_chat_stream(payloads).content == "Hi there"


def test_a_streamed_response_whose_client_left_before_its_body_abandons_the_begun_source() -> None:
    """The body's own code never runs when the headers cannot go out: the response's end
    abandons the generation begun for it (cancelled, its admission place given back)."""
    log: list[str] = []
    source = Beginning(ANSWER, log)
    response = asyncio.run(StreamRun(source, LoggedStart(log), name="c").stream(encode, None))
    call_response(response, [], refuse=True)
    assert log == ["begin", "abandon"]
