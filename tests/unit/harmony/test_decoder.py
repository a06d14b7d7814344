"""HarmonyDecoder: literal token sequences in, segment events out, never an exception."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.events import (
    DecodeWarning,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
)
from server.harmony.decoder import (
    HarmonyDecoder,
    ParserStock,
    new_call_id,
    new_parser,
    segment_kind,
)

Event = SegmentStart | SegmentDelta | SegmentEnd | DecodeWarning


def decode_tokens(
    encoding: HarmonyEncoding, tokens: list[int]
) -> tuple[list[Event], HarmonyDecoder]:
    decoder = HarmonyDecoder(encoding)
    events: list[Event] = []
    for token in tokens:
        events.extend(decoder.feed(token))
    events.extend(decoder.finish())
    return events, decoder


def decode(encoding: HarmonyEncoding, text: str) -> tuple[list[Event], HarmonyDecoder]:
    return decode_tokens(encoding, encoding.encode(text, allowed_special="all"))


def ends(events: list[Event]) -> list[SegmentEnd]:
    return [e for e in events if isinstance(e, SegmentEnd)]


def assert_well_formed(events: list[Event]) -> None:
    """Every segment: one start, deltas, one end; deltas add up to the end's text."""
    open_index: int | None = None
    parts: list[str] = []
    for event in events:
        if isinstance(event, SegmentStart):
            assert open_index is None
            open_index, parts = event.index, []
        elif isinstance(event, SegmentDelta):
            assert event.index == open_index
            parts.append(event.text)
        elif isinstance(event, SegmentEnd):
            assert event.index == open_index
            assert "".join(parts) == event.text
            open_index = None
    assert open_index is None


def test_reasoning_then_final(encoding: HarmonyEncoding) -> None:
    events, decoder = decode(
        encoding,
        "<|channel|>analysis<|message|>User says hi. Reply.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>",
    )
    assert_well_formed(events)
    starts = [e for e in events if isinstance(e, SegmentStart)]
    assert [(s.index, s.kind, s.channel) for s in starts] == [
        (0, SegmentKind.REASONING, "analysis"),
        (1, SegmentKind.FINAL, "final"),
    ]
    reasoning, final = ends(events)
    assert reasoning.text == "User says hi. Reply."
    assert final.text == "Hello there!"
    assert reasoning.complete
    assert final.complete
    assert encoding.decode_utf8(list(reasoning.tokens)).startswith("<|channel|>analysis")
    assert reasoning.tokens[-1] == 200007
    assert encoding.decode_utf8(list(final.tokens)).startswith("<|start|>assistant<|channel|>")
    assert final.tokens[-1] == 200002
    assert decoder.reasoning_tokens == len(reasoning.tokens)
    assert not any(isinstance(e, DecodeWarning) for e in events)
    assert decoder.left_grammar is False
    deltas = [(e.index, e.kind) for e in events if isinstance(e, SegmentDelta)]
    assert set(deltas) == {(0, SegmentKind.REASONING), (1, SegmentKind.FINAL)}


def test_reasoning_tokens_add_up_and_indexes_count_on(encoding: HarmonyEncoding) -> None:
    events, decoder = decode(
        encoding,
        "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Two.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
    )
    first, second, final = ends(events)
    assert decoder.reasoning_tokens == len(first.tokens) + len(second.tokens)
    assert [e.index for e in events if isinstance(e, SegmentStart)] == [0, 1, 2]
    assert final.index == 2


def test_the_assistant_as_recipient_is_no_call() -> None:
    assert segment_kind("final", "assistant") is SegmentKind.FINAL
    assert segment_kind("commentary", "assistant") is SegmentKind.PREAMBLE
    assert segment_kind("commentary", "functions.f") is SegmentKind.TOOL_CALL


@pytest.mark.parametrize(
    "text",
    [
        "<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"location":"SF"}<|call|>',
        " to=functions.get_weather<|channel|>commentary <|constrain|>json"
        '<|message|>{"location":"SF"}<|call|>',
        "<|channel|>analysis<|message|>Call it.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
        '<|message|>{"location":"SF"}<|call|>',
    ],
    ids=["recipient-after-channel", "recipient-in-role", "recipient-in-role-second-message"],
)
def test_tool_call(encoding: HarmonyEncoding, text: str) -> None:
    events, _ = decode(encoding, text)
    assert_well_formed(events)
    start = [e for e in events if isinstance(e, SegmentStart)][-1]
    assert start.kind is SegmentKind.TOOL_CALL
    assert start.recipient == "functions.get_weather"
    assert start.content_type == "<|constrain|>json"
    end = ends(events)[-1]
    assert end.text == '{"location":"SF"}'
    assert end.tokens[-1] == 200012
    assert not any(isinstance(e, DecodeWarning) for e in events)


# Header forms real gpt-oss writes (seen in public llama.cpp, LM Studio, vLLM, SGLang reports):
# header, channel, content type
REAL_CALL_HEADERS = [
    ("<|channel|>commentary to=functions.f<|constrain|>json", "commentary", "<|constrain|>json"),
    ("<|channel|>analysis to=functions.f <|constrain|>json", "analysis", "<|constrain|>json"),
    ("<|channel|>analysis to=functions.f<|constrain|>json", "analysis", "<|constrain|>json"),
    ("<|channel|>analysis to=functions.f", "analysis", None),
    ("<|channel|>commentary to=functions.f code", "commentary", "code"),
    ("<|channel|>commentary to=functions.f json", "commentary", "json"),
    (" to=functions.f<|channel|>commentary json", "commentary", "json"),
    (" to=functions.f<|channel|>analysis<|constrain|>json", "analysis", "<|constrain|>json"),
]


@pytest.mark.parametrize(("header", "channel", "content_type"), REAL_CALL_HEADERS)
@pytest.mark.parametrize("second", [False, True], ids=["first", "after-reasoning"])
def test_real_call_header_forms_are_tool_calls(
    encoding: HarmonyEncoding, header: str, channel: str, content_type: str | None, second: bool
) -> None:
    before = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant" if second else ""
    events, decoder = decode(encoding, f'{before}{header}<|message|>{{"a":1}}<|call|>')
    assert_well_formed(events)
    assert not decoder.left_grammar
    assert not any(isinstance(e, DecodeWarning) for e in events)
    call = ends(events)[-1]
    assert [e.kind for e in ends(events)][:-1] == ([SegmentKind.REASONING] if second else [])
    assert call.kind is SegmentKind.TOOL_CALL  # on the analysis channel too: it has a recipient
    assert (call.recipient, call.channel, call.content_type) == (
        "functions.f",
        channel,
        content_type,
    )
    assert call.text == '{"a":1}'
    assert call.complete
    assert call.call_id is not None
    assert decoder.reasoning_tokens == (len(ends(events)[0].tokens) if second else 0)


def test_preamble_is_commentary_without_recipient(encoding: HarmonyEncoding) -> None:
    events, _ = decode(
        encoding,
        "<|channel|>commentary<|message|>Checking the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{}<|call|>",
    )
    assert_well_formed(events)
    assert [e.kind for e in ends(events)] == [SegmentKind.PREAMBLE, SegmentKind.TOOL_CALL]


def test_multibyte_characters_are_never_split(encoding: HarmonyEncoding) -> None:
    events, _ = decode(encoding, "<|channel|>final<|message|>unicorn 🦄 and ünïcödé<|return|>")
    assert_well_formed(events)
    deltas = [e.text for e in events if isinstance(e, SegmentDelta)]
    assert "".join(deltas) == "unicorn 🦄 and ünïcödé"
    assert all("\ufffd" not in d for d in deltas)


def test_truncated_content_closes_incomplete(encoding: HarmonyEncoding) -> None:
    events, _ = decode(encoding, "<|channel|>analysis<|message|>Thinking about")
    assert_well_formed(events)
    (end,) = ends(events)
    assert end.kind is SegmentKind.REASONING
    assert end.text == "Thinking about"
    assert end.complete is False


def test_truncated_header_is_a_warning(encoding: HarmonyEncoding) -> None:
    events, _ = decode(
        encoding,
        "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>fin",
    )
    assert_well_formed(events)
    assert len(ends(events)) == 1
    warning = events[-1]
    assert isinstance(warning, DecodeWarning)
    assert warning.message == "generation ended inside a message header"
    assert warning.text == "<|start|>assistant<|channel|>fin"


def test_text_after_end_does_not_raise(encoding: HarmonyEncoding) -> None:
    events, _ = decode(encoding, "<|channel|>final<|message|>Hi<|end|>stray text here<|return|>")
    assert_well_formed(events)
    assert [e.text for e in ends(events)] == ["Hi"]
    warning = events[-1]
    assert isinstance(warning, DecodeWarning)
    assert "harmony" in warning.message
    assert warning.text == "stray text here<|return|>"


def test_text_after_end_inside_open_segment_closes_it(encoding: HarmonyEncoding) -> None:
    events, _ = decode(
        encoding,
        "<|channel|>analysis<|message|>a<|end|>oops<|start|>assistant<|channel|>final"
        "<|message|>late<|return|>",
    )
    assert_well_formed(events)
    assert [e.text for e in ends(events)] == ["a"]
    assert isinstance(events[-1], DecodeWarning)


def test_missing_channel_is_final(encoding: HarmonyEncoding) -> None:
    events, _ = decode(encoding, "<|message|>Hello<|return|>")
    assert_well_formed(events)
    (end,) = ends(events)
    assert end.kind is SegmentKind.FINAL
    assert end.text == "Hello"


def test_header_without_message_token_is_recovered(encoding: HarmonyEncoding) -> None:
    events, decoder = decode(encoding, "<|channel|>final Hello there<|return|>")
    assert_well_formed(events)
    (end,) = ends(events)
    assert end.kind is SegmentKind.FINAL
    assert "Hello there" in end.text
    assert decoder.left_grammar  # recovered, yet outside the grammar
    events, _ = decode(encoding, "<|channel|>final<|return|>")
    assert [type(e) for e in events] == [SegmentStart, SegmentEnd]  # no empty delta


SAMPLES = [
    "<|channel|>analysis<|message|>Need ls.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.exec_command <|constrain|>json<|message|>{"cmd":"ls"}<|call|>',
    "<|channel|>analysis<|message|>Think 🦄.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Done.<|return|>",
]


def test_mutated_sequences_never_raise(encoding: HarmonyEncoding) -> None:
    rng = random.Random(1234)
    specials = [200002, 200003, 200005, 200006, 200007, 200008, 200012, 199999]
    base = [encoding.encode(s, allowed_special="all") for s in SAMPLES]
    for _ in range(400):
        tokens = list(rng.choice(base))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(tokens) + 1)
            op = rng.random()
            if op < 0.4:
                tokens.insert(at, rng.choice(specials))
            elif op < 0.7 and tokens:
                del tokens[min(at, len(tokens) - 1)]
            else:
                tokens.insert(at, rng.randrange(0, 199998))
        events, _ = decode_tokens(encoding, tokens)
        assert_well_formed(events)


def test_a_stock_gives_fresh_parsers_and_makes_one_when_empty(encoding: HarmonyEncoding) -> None:
    stock = ParserStock(encoding, size=2)
    assert stock.ready == 2
    taken = [stock.take() for _ in range(3)]  # the third made on the spot
    assert len({id(parser) for parser in taken}) == 3
    assert stock.ready == 0
    stock.restock()
    assert stock.ready == 2
    text = (
        "<|channel|>analysis<|message|>Think.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hi<|return|>"
    )
    tokens = encoding.encode(text, allowed_special="all")
    expected, _ = decode_tokens(encoding, tokens)
    stocked = HarmonyDecoder(encoding, parser=stock.take())
    events = [event for token in tokens for event in stocked.feed(token)] + stocked.finish()
    assert events == expected


def _without_call_ids(events: list[Event]) -> list[Event]:
    """Events with their call ids left out (each decoder draws its own)."""
    return [
        dataclasses.replace(e, call_id=None) if isinstance(e, SegmentStart | SegmentEnd) else e
        for e in events
    ]


def _sequences(encoding: HarmonyEncoding) -> list[list[int]]:
    """The samples, their truncations at every point of the first header, and mutations."""
    rng = random.Random(99)
    base = [encoding.encode(s, allowed_special="all") for s in SAMPLES]
    sequences = [tokens[:cut] for tokens in base for cut in range(len(tokens) + 1)]
    specials = [200002, 200005, 200006, 200007, 200008, 200012]
    for _ in range(60):
        tokens = list(rng.choice(base))
        at = rng.randrange(6)
        tokens.insert(at, rng.choice([*specials, rng.randrange(0, 199998)]))
        sequences.append(tokens)
    return sequences


def _rejects(encoding: HarmonyEncoding, tokens: list[int]) -> bool:
    decoder = HarmonyDecoder(encoding)
    for token in tokens:
        decoder.feed(token)
    return bool(decoder._rejected)


def test_tokens_parsed_ahead_give_the_events_of_tokens_parsed_as_they_come(
    encoding: HarmonyEncoding,
) -> None:
    """Whatever was expected — the sequence's own first tokens, fewer or more of them, another
    header — the events, the reasoning count and the grammar flag are those of a decoder that
    expected nothing; the stock gets the unused parser back when the expected tokens came."""
    analysis = encoding.encode("<|channel|>analysis<|message|>", allowed_special="all")
    final = encoding.encode("<|channel|>final<|message|>", allowed_special="all")
    for tokens in _sequences(encoding):
        plain, plain_decoder = decode_tokens(encoding, tokens)
        for likely in (tokens[:1], tokens[:2], tokens[:3], analysis, final, [*tokens, 7]):
            stock = ParserStock(encoding, size=2)
            decoder = HarmonyDecoder(encoding, parser=stock.take())
            decoder.expect(likely, stock)
            events = [event for token in tokens for event in decoder.feed(token)]
            events += decoder.finish()
            assert _without_call_ids(events) == _without_call_ids(plain), (tokens, likely)
            assert decoder.reasoning_tokens == plain_decoder.reasoning_tokens
            assert decoder.left_grammar == plain_decoder.left_grammar
            # a parse ahead takes a parser; the decoder's own, unused, goes back when the
            # tokens came (and the parse ahead was kept: harmony took them)
            came = bool(likely) and tokens[: len(likely)] == list(likely)
            came = came and not _rejects(encoding, likely)
            assert (stock.ready, stock.spare) == ((2, 0) if came else (1, int(not likely)))


def test_nothing_is_parsed_ahead_without_a_spare_parser(encoding: HarmonyEncoding) -> None:
    """A parse ahead takes a spare, never a parser a generation starting meanwhile needs."""
    stock = ParserStock(encoding, size=1, spares=0)
    decoder = HarmonyDecoder(encoding, parser=stock.take())
    stock.restock()
    analysis = encoding.encode("<|channel|>analysis<|message|>", allowed_special="all")
    decoder.expect(analysis, stock)  # no spare: nothing is made for it, nor taken
    assert (stock.ready, stock.spare) == (1, 0)
    events = [event for token in analysis for event in decoder.feed(token)]
    assert [type(event) for event in events] == [SegmentStart]
    assert (stock.ready, stock.spare) == (1, 0)


def test_a_stock_keeps_what_it_is_given_back_up_to_its_sizes(encoding: HarmonyEncoding) -> None:
    stock = ParserStock(encoding)
    assert (stock.ready, stock.spare) == (1, 1)  # one of each unless told
    first = stock.take()
    stock.give_back(first)
    assert stock.take() is first  # the same parser, not another
    stock.give_back(first)
    spare = stock.take_spare()
    assert spare is not None
    assert stock.take_spare() is None  # none is made on the spot
    stock.give_back(spare)  # ready is full: it becomes the spare
    assert (stock.ready, stock.spare) == (1, 1)
    assert stock.take_spare() is spare
    stock.give_back(spare)
    stock.give_back(new_parser(encoding))  # both full: dropped
    assert (stock.ready, stock.spare) == (1, 1)


def test_nothing_is_parsed_ahead_once_tokens_came(encoding: HarmonyEncoding) -> None:
    """`expect` is for a generation's first tokens only: after a header token, a whole
    message, or a rejected token it takes no spare and changes nothing."""
    analysis = encoding.encode("<|channel|>analysis<|message|>", allowed_special="all")
    message = encoding.encode("<|channel|>analysis<|message|>Hm.<|end|>", allowed_special="all")
    rejected = encoding.encode("<|channel|>analysis<|message|>Hm.<|end|>x", allowed_special="all")
    for fed in (analysis[:1], message, rejected):
        stock = ParserStock(encoding)
        decoder = HarmonyDecoder(encoding, parser=stock.take())
        for token in fed:
            decoder.feed(token)
        decoder.expect(analysis, stock)
        assert stock.spare == 1, fed
    stock = ParserStock(encoding)
    HarmonyDecoder(encoding, parser=stock.take()).expect([], stock)
    assert stock.spare == 1


def test_a_call_parsed_ahead_takes_its_id_and_parser_from_the_decoder(
    encoding: HarmonyEncoding,
) -> None:
    header = encoding.encode(
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>", allowed_special="all"
    )
    stock = ParserStock(encoding)
    own = stock.take()
    decoder = HarmonyDecoder(encoding, lambda: "call_fixed", parser=own)
    spare = stock._spare[-1]
    decoder.expect(header, stock)
    events = [event for token in header for event in decoder.feed(token)]
    (start,) = events
    assert isinstance(start, SegmentStart)
    assert start.call_id == "call_fixed"
    assert decoder._parser is spare  # the spare parsed the header; the decoder's own went back
    assert (stock.ready, stock.spare) == (1, 0)
    assert stock.take() is own


def test_a_rejected_header_is_reported_without_the_models_text(
    encoding: HarmonyEncoding, caplog: pytest.LogCaptureFixture
) -> None:
    """harmony quotes the model's text after a colon ("Unknown role: bo:gus"): the warning
    and the log keep the reason before it; the warning holds the tokens from the rejected one."""
    events, decoder = decode(
        encoding, "<|channel|>final<|message|>Hi<|end|><|start|>bo:gus<|message|>x<|end|>"
    )
    assert [e.text for e in ends(events)] == ["Hi"]
    reason = "model output left the harmony format: Unknown role"
    assert events[-1] == DecodeWarning(reason, "<|message|>x<|end|>", (200008, 87, 200007))
    assert decoder.left_grammar
    assert [r.getMessage() for r in caplog.records if r.name == "server.harmony.decoder"] == [
        reason
    ]


def test_a_terminator_that_ends_no_message_is_a_warning(encoding: HarmonyEncoding) -> None:
    events, decoder = decode(encoding, "<|end|>")
    assert events == [DecodeWarning("a terminator token ended no message", "<|end|>", (200007,))]
    assert decoder.left_grammar


def test_call_ids_are_24_hex_digits_each_new() -> None:
    ids = {new_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call_id) for call_id in ids)
