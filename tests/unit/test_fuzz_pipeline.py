"""Fuzzing: random and mutated token sequences through the decoder and both API emitters.

Sequences are random token ids (every id up to 201087, reserved specials included) or real
harmony outputs with specials inserted, tokens deleted or replaced, spans spliced in from other
outputs, and truncations. Each goes through the generation core's own code
(server.core.client_events' ClientEvents: the HarmonyDecoder, stop strings, the tool-name
mapping; then finished_event), fed in engine-sized chunks; the events then
run through the Chat Completions stream (chunks, checked by tests/support/chat_grammar.py) and
its non-streaming fold, through the Responses run (events checked by
tests/support/event_grammar.py against the openai SDK's types), its fold and the store's items,
and through the Messages run (events checked by tests/support/anthropic.py against the anthropic
SDK's types) and its fold.
Nothing may raise; every stream must be grammatical and end with its terminal event.

hypothesis drives it (failures shrink to a minimal sequence), derandomized so CI runs the same
examples every time. Each test asserts how many sequences it tried (≥ 10,000 in all).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import HarmonyEncoding

from server.api.chat.emitter import ChatEmitter, ChatEvent, ChunkFactory, encode, fold
from server.api.messages.emitter import MessagesEmitter
from server.api.messages.emitter import fold as fold_message
from server.api.messages.schemas import StreamEvent as MessageEvent
from server.api.messages.signature import ThinkingSigner
from server.api.responses.adapter import output_items
from server.api.responses.emitter import ResponsesEmitter
from server.api.responses.emitter import fold as fold_response
from server.api.responses.schemas import ResponseObject, StreamEvent
from server.api.responses.store import item_from_json, item_to_json
from server.api.sse import sse_typed
from server.api.stream_run import Ended, StreamRun
from server.contracts.errors import ServerError
from server.contracts.events import (
    DecodeWarning,
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
    Timings,
    Usage,
)
from server.contracts.transcript import ToolSpec
from server.core.client_events import ClientEvents
from server.core.finish import finished_event
from server.core.stop_strings import StopStrings
from server.core.tool_names import ToolNames
from server.core.visibility import ReasoningView
from server.engine.base import EngineResult, StopReason
from server.harmony.decoder import HarmonyDecoder
from server.harmony.render import assistant_start_tokens
from tests.support.anthropic import check_messages_sse
from tests.support.chat_grammar import check_chat_body, check_chat_stream
from tests.support.event_grammar import check_stream
from tests.support.generation import Generation
from tests.support.sse import parse_sse

pytestmark = pytest.mark.slow  # hypothesis runs thousands of token sequences

RETURN, CALL = 200002, 200012
STOP_TOKENS = (RETURN, CALL)
LAST_ID = 201087  # the last id of o200k_harmony; 199998 and up are specials, most reserved
SPECIALS = (199998, 199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012, 200018)
TOOLS = (
    ToolSpec("exec_command"),
    ToolSpec("get_weather"),
    ToolSpec("apply_patch", kind="custom"),
    ToolSpec("close_agent", namespace="multi_agent_v1"),
    ToolSpec("my-tool.v2"),  # not an identifier: the model writes functions.my_tool_v2
)

# Real harmony outputs (what gpt-oss samples after `<|start|>assistant`).
SAMPLES = (
    "<|channel|>analysis<|message|>User says hi. Reply briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location":"San Francisco"}<|call|>',
    "<|channel|>commentary<|message|>Checking the files.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
    '<|message|>{"cmd":["ls","-la"]}<|call|>',
    "<|channel|>analysis<|message|>Call it.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    '<|message|>{"location":"Tokyo"}<|call|>',
    "<|channel|>analysis<|message|>L'utilisateur écrit en 日本語 🦄.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>こんにちは 🦄 — ünïcödé ✓<|return|>",
    "<|channel|>analysis<|message|>Patch it.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.apply_patch <|constrain|>json"
    '<|message|>{"input":"*** Begin Patch\\n*** End Patch"}<|call|>',
    " to=multi_agent_v1.close_agent<|channel|>commentary <|constrain|>json"
    '<|message|>{"id":"a1"}<|call|>',
    "<|channel|>commentary to=functions.my_tool_v2 <|constrain|>json<|message|>{}<|call|>",
    "<|channel|>analysis<|message|>First thought.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Second thought.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done: 2 + 2 = 4.<|return|>",
)
# Pieces random sequences are built from, besides raw token ids.
PIECES = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "assistant",
    "analysis",
    "final",
    "commentary",
    " to=functions.get_weather",
    " to=multi_agent_v1.close_agent",
    " to=",
    "functions.",
    " <|constrain|>json",
    "json",
    '{"a": 1}',
    "Hello",
    " 🦄",
    "日本語",
    "é",
    "user",
    "tool",
)

tokens_st = st.one_of(
    st.sampled_from(SPECIALS),
    st.integers(199998, LAST_ID),  # specials, most of them reserved
    st.integers(0, LAST_ID),
)
piece_st = st.one_of(st.sampled_from(PIECES), tokens_st)
reason_st = st.sampled_from((FinishReason.LENGTH, FinishReason.CANCELLED, FinishReason.ERROR))
stops_st = st.sampled_from(((), (), ("!",), ("4.", "🦄"), ("Hel",)))
N_RANDOM, N_MUTATED, N_PIECES = 2000, 6000, 2000
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Mutation:
    op: str  # insert | delete | replace | splice | truncate
    at: int  # position, modulo the sequence length
    token: int
    span: tuple[int, int, int] = (0, 0, 0)  # splice: sample, start, length


mutation_st = st.builds(
    Mutation,
    op=st.sampled_from(("insert", "insert", "delete", "replace", "splice", "truncate")),
    at=st.integers(0, 1 << 16),
    token=tokens_st,
    span=st.tuples(st.integers(0, len(SAMPLES) - 1), st.integers(0, 80), st.integers(1, 12)),
)


def mutate(samples: Sequence[list[int]], base: int, mutations: Sequence[Mutation]) -> list[int]:
    tokens = list(samples[base])
    for m in mutations:
        at = m.at % (len(tokens) + 1)
        if m.op == "insert":
            tokens.insert(at, m.token)
        elif m.op == "delete" and tokens:
            del tokens[min(at, len(tokens) - 1)]
        elif m.op == "replace" and tokens:
            tokens[min(at, len(tokens) - 1)] = m.token
        elif m.op == "splice":
            source, start, length = m.span
            tokens[at:at] = samples[source][start : start + length]
        elif m.op == "truncate":
            del tokens[at:]
    return tokens


# ------------------------------------------------------------------------------ the pipeline


ENGINE_STOPS = {  # why the engine stopped when no stop token ended the output
    FinishReason.LENGTH: StopReason.MAX_TOKENS,
    FinishReason.CANCELLED: StopReason.CANCELLED,
    FinishReason.ERROR: StopReason.ERROR,
}
CHUNK = 3  # tokens per engine chunk: deltas of one segment within a chunk are joined


def generate(
    encoding: HarmonyEncoding,
    tokens: Sequence[int],
    stops: Sequence[str],
    otherwise: FinishReason,
) -> list[GenerationEvent]:
    """What the generation core (server.core.client_events, server.core.finish) makes of
    these sampled tokens. The engine's part is played as the engine plays it: it ends the
    output at a stop token, hands tokens over in chunks, and stops when a stop string matched;
    `otherwise` is why it stopped if there is no stop token."""
    end = next((i + 1 for i, token in enumerate(tokens) if token in STOP_TOKENS), len(tokens))
    sampled = list(tokens[:end])
    decoder = HarmonyDecoder(encoding)
    client = ClientEvents(decoder, StopStrings(stops), ToolNames(TOOLS))
    events: list[GenerationEvent] = []
    for at in range(0, len(sampled), CHUNK):
        events.extend(client.feed(sampled[at : at + CHUNK]))
        if client.stopped:
            break
    if not client.stopped:
        events.extend(client.finish())
    stop_token = sampled[-1] if sampled and sampled[-1] in STOP_TOKENS else None
    result = EngineResult(
        StopReason.STOP_TOKEN if stop_token is not None else ENGINE_STOPS[otherwise],
        Usage(prompt_tokens=42, cached_tokens=7, evaluated_tokens=35,
              completion_tokens=len(sampled)),
        Timings(),
        stop_token=stop_token,
        error="the engine failed" if stop_token is None and otherwise is FinishReason.ERROR
        else None,
    )  # fmt: skip
    events.append(finished_event(result, decoder.reasoning_tokens, stopped=client.stop_sequence))
    return events


def check_segments(events: Sequence[GenerationEvent]) -> None:
    """Decoder grammar: start, deltas, end per segment, in order; warnings between segments."""
    open_start: SegmentStart | None = None
    parts: list[str] = []
    next_index = 0
    for event in events[:-1]:
        assert not isinstance(event, Finished), "Finished before the end"
        if isinstance(event, SegmentStart):
            assert open_start is None, "a segment started inside another"
            assert event.index >= next_index
            open_start, parts, next_index = event, [], event.index + 1
        elif isinstance(event, SegmentDelta):
            assert open_start is not None
            assert event.index == open_start.index
            assert event.kind is open_start.kind
            parts.append(event.text)
        elif isinstance(event, SegmentEnd):
            assert open_start is not None
            assert event.index == open_start.index
            assert "".join(parts) == event.text
            if event.kind is SegmentKind.TOOL_CALL:  # stop strings cut FINAL segments only
                assert event.recipient == open_start.recipient
                assert event.call_id == open_start.call_id
            open_start = None
        else:
            assert isinstance(event, DecodeWarning)
            assert open_start is None, "a warning inside a segment"
    assert open_start is None, "a segment was left open"
    assert isinstance(events[-1], Finished)


def check_chat(
    loop: asyncio.AbstractEventLoop, events: Sequence[GenerationEvent], include_reasoning: bool
) -> None:
    finished = events[-1]
    assert isinstance(finished, Finished)
    factory = ChunkFactory("chatcmpl-fuzz", 1, "gpt-oss-tiny")

    def run(include_usage: bool) -> tuple[ChatEmitter, list[ChatEvent]]:
        emitter = ChatEmitter(factory, include_reasoning, include_usage=include_usage)
        chat_run = StreamRun(Generation(events), emitter, name="completion chatcmpl-fuzz")

        async def collect() -> list[ChatEvent]:
            return [event async for event in chat_run.events()]

        return emitter, loop.run_until_complete(collect())

    _, streamed_events = run(include_usage=True)
    raw = b"".join(encode(event) for event in streamed_events)
    payloads = [event.data for event in parse_sse(raw.decode().splitlines())]
    cancelled = finished.reason is FinishReason.CANCELLED
    streamed = check_chat_stream(payloads, cancelled=cancelled)
    assert (streamed.error is not None) == (finished.reason is FinishReason.ERROR)
    translator, folded_events = run(include_usage=False)
    if finished.reason is FinishReason.ERROR:
        with pytest.raises(ServerError):
            fold(folded_events, translator)
        return
    body = json.loads(json.dumps(fold(folded_events, translator)))
    clean = not cancelled
    completion = check_chat_body(body, streamed if clean else None)
    assert (completion.choices[0].message.content or "") == streamed.content
    if not include_reasoning:
        assert streamed.reasoning == ""


def check_responses(
    loop: asyncio.AbstractEventLoop, encoding: HarmonyEncoding, events: Sequence[GenerationEvent]
) -> None:
    counter = itertools.count()
    emitter = ResponsesEmitter(
        ResponseObject(id="resp_fuzz", created_at=1, model="gpt-oss-tiny"),
        new_item_id=lambda prefix: f"{prefix}{next(counter)}",
    )
    finished: list[tuple[ResponseObject, list[Ended]]] = []

    async def finish(last: list[StreamEvent], ended: list[Ended]) -> None:
        finished.append((fold_response(last), list(ended)))

    async def collect() -> list[Any]:
        run = StreamRun(Generation(events), emitter, name="response resp_fuzz", finish=finish)
        return [event async for event in run.events()]

    stream_events = loop.run_until_complete(collect())
    checked = check_stream([event.model_dump(mode="json") for event in stream_events])
    response = fold_response(stream_events)
    assert response.model_dump(mode="json") == checked.terminal["response"]
    ((stored, ended),) = finished  # the store callback ran once, with the terminal response
    assert stored is response
    items = output_items(ended, assistant_start_tokens(encoding))
    for item in items:
        assert item_from_json(json.loads(json.dumps(item_to_json(item)))) == item


SIGNER = ThinkingSigner(b"f" * 32)


def check_messages(
    loop: asyncio.AbstractEventLoop,
    encoding: HarmonyEncoding,
    events: Sequence[GenerationEvent],
    include_reasoning: bool,
) -> None:
    finished = events[-1]
    assert isinstance(finished, Finished)
    emitter = MessagesEmitter(
        "msg_fuzz",
        "gpt-oss-tiny",
        input_tokens=42,
        signer=SIGNER,
        message_start=assistant_start_tokens(encoding),
        view=ReasoningView(raw=include_reasoning, summary=None),
    )

    async def collect() -> list[MessageEvent]:
        run = StreamRun(Generation(events), emitter, name="message msg_fuzz")
        return [event async for event in run.events()]

    streamed = loop.run_until_complete(collect())
    raw = b"".join(sse_typed(event) for event in streamed)
    checked = check_messages_sse(raw.decode().splitlines())
    failed = checked.types()[-1] == "error"  # a cancelled message ends with an error too
    assert failed == (finished.reason in (FinishReason.ERROR, FinishReason.CANCELLED))
    if failed:
        with pytest.raises(ServerError):
            fold_message(streamed)
        return
    message = fold_message(streamed)
    kinds = [block["type"] for block in checked.blocks()]
    assert [block.type for block in message.content] == kinds
    if not include_reasoning:
        assert all(block.type != "thinking" or not block.thinking for block in message.content)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module")
def samples(encoding: HarmonyEncoding) -> list[list[int]]:
    return [encoding.encode(text, allowed_special="all") for text in SAMPLES]


def run_all(
    loop: asyncio.AbstractEventLoop,
    encoding: HarmonyEncoding,
    tokens: Sequence[int],
    *,
    stops: Sequence[str],
    otherwise: FinishReason,
    include_reasoning: bool,
) -> None:
    events = generate(encoding, tokens, stops, otherwise)
    check_segments(events)
    check_chat(loop, events, include_reasoning)
    check_responses(loop, encoding, events)
    check_messages(loop, encoding, events, include_reasoning)


def test_samples_are_well_formed(
    loop: asyncio.AbstractEventLoop, encoding: HarmonyEncoding, samples: list[list[int]]
) -> None:
    """The unmutated outputs decode without a warning and finish as the model meant."""
    for tokens in samples:
        events = generate(encoding, tokens, (), FinishReason.LENGTH)
        assert not any(isinstance(e, DecodeWarning) for e in events)
        finished = events[-1]
        assert isinstance(finished, Finished)
        assert finished.reason in (FinishReason.STOP, FinishReason.TOOL_CALL)
        run_all(
            loop, encoding, tokens, stops=(), otherwise=FinishReason.LENGTH, include_reasoning=True
        )


def test_random_token_sequences(loop: asyncio.AbstractEventLoop, encoding: HarmonyEncoding) -> None:
    tried = 0

    @settings(FUZZ, max_examples=N_RANDOM)
    @given(
        tokens=st.lists(tokens_st, max_size=40),
        stops=stops_st,
        otherwise=reason_st,
        include_reasoning=st.booleans(),
    )
    def fuzz(
        tokens: list[int], stops: tuple[str, ...], otherwise: FinishReason, include_reasoning: bool
    ) -> None:
        nonlocal tried
        tried += 1
        run_all(
            loop,
            encoding,
            tokens,
            stops=stops,
            otherwise=otherwise,
            include_reasoning=include_reasoning,
        )

    fuzz()
    assert tried >= N_RANDOM


def test_random_harmony_pieces(loop: asyncio.AbstractEventLoop, encoding: HarmonyEncoding) -> None:
    tried = 0

    @settings(FUZZ, max_examples=N_PIECES)
    @given(
        pieces=st.lists(piece_st, max_size=32),
        stops=stops_st,
        otherwise=reason_st,
        include_reasoning=st.booleans(),
    )
    def fuzz(
        pieces: list[str | int],
        stops: tuple[str, ...],
        otherwise: FinishReason,
        include_reasoning: bool,
    ) -> None:
        nonlocal tried
        tried += 1
        tokens: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                tokens.append(piece)
            else:
                tokens.extend(encoding.encode(piece, allowed_special="all"))
        run_all(
            loop,
            encoding,
            tokens,
            stops=stops,
            otherwise=otherwise,
            include_reasoning=include_reasoning,
        )

    fuzz()
    assert tried >= N_PIECES


def test_mutated_harmony_outputs(
    loop: asyncio.AbstractEventLoop, encoding: HarmonyEncoding, samples: list[list[int]]
) -> None:
    tried = 0

    @settings(FUZZ, max_examples=N_MUTATED)
    @given(
        base=st.integers(0, len(SAMPLES) - 1),
        mutations=st.lists(mutation_st, min_size=1, max_size=6),
        stops=stops_st,
        otherwise=reason_st,
        include_reasoning=st.booleans(),
    )
    def fuzz(
        base: int,
        mutations: list[Mutation],
        stops: tuple[str, ...],
        otherwise: FinishReason,
        include_reasoning: bool,
    ) -> None:
        nonlocal tried
        tried += 1
        tokens = mutate(samples, base, mutations)
        run_all(
            loop,
            encoding,
            tokens,
            stops=stops,
            otherwise=otherwise,
            include_reasoning=include_reasoning,
        )

    fuzz()
    assert tried >= N_MUTATED
