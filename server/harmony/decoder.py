"""HarmonyDecoder: sampled token ids -> segment events, token by token, while sampling runs.

The only owner of openai-harmony's StreamableParser. Each harmony assistant message becomes one
segment (start, deltas, end) whose kind comes from its channel and recipient. Malformed output
never raises out of here: when the parser rejects a token, the open segment is closed as
incomplete and everything after it is reported in a DecodeWarning when the decoder finishes;
`left_grammar` tells the generation core to log and count the incident (never with the model's
text: it can be chain of thought).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from openai_harmony import HarmonyEncoding, HarmonyError, Message, Role, StreamableParser

from server.contracts.events import (
    DecoderEvent,
    DecodeWarning,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
)
from server.harmony.tokens import MESSAGE
from server.harmony.tokens import MESSAGE_TERMINATORS as TERMINATORS

log = logging.getLogger(__name__)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def segment_kind(channel: str | None, recipient: str | None) -> SegmentKind:
    """What a harmony message is for the API: tool call, reasoning, preamble or final text."""
    if recipient and recipient != "assistant":
        return SegmentKind.TOOL_CALL
    if channel == "analysis":
        return SegmentKind.REASONING
    if channel == "commentary":
        return SegmentKind.PREAMBLE
    return SegmentKind.FINAL


@dataclass
class _Ahead:
    """Tokens parsed ahead by a decoder of their own, its events, and how many of them the
    generation's first tokens matched so far."""

    tokens: tuple[int, ...]
    decoder: HarmonyDecoder
    events: list[DecoderEvent]
    stock: ParserStock
    matched: int = 0


@dataclass
class _Segment:
    start: SegmentStart
    parts: list[str] = field(default_factory=list)


def new_parser(encoding: HarmonyEncoding) -> StreamableParser:
    """A lenient streaming parser of one assistant turn."""
    return StreamableParser(encoding, Role.ASSISTANT, strict=False)


class ParserStock:
    """Streaming parsers made before the generations that use them.

    Making one renders harmony's stop tokens through the tokenizer (≈ 0.5 ms in a server
    between requests); made when a generation starts, it would hold the GIL the engine thread
    needs to start the prefill. A generation takes a parser made earlier (one is made on the
    spot when none is left) and `restock` makes the next ones once it ended.

    Beside them, `spares` parsers for parsing a generation's likely first tokens ahead
    (`HarmonyDecoder.expect`): kept apart, so that parsing ahead never leaves a generation that
    starts meanwhile without one.
    """

    def __init__(self, encoding: HarmonyEncoding, size: int = 1, spares: int = 1) -> None:
        self._encoding = encoding
        self._size = size
        self._spares = spares
        self._ready: list[StreamableParser] = []
        self._spare: list[StreamableParser] = []
        self.restock()

    def take(self) -> StreamableParser:
        return self._ready.pop() if self._ready else new_parser(self._encoding)

    def take_spare(self) -> StreamableParser | None:
        """A spare parser, or None (none is made on the spot)."""
        return self._spare.pop() if self._spare else None

    def give_back(self, parser: StreamableParser) -> None:
        """A parser that processed no token, for the next generation (or as a spare)."""
        if len(self._ready) < self._size:
            self._ready.append(parser)
        elif len(self._spare) < self._spares:
            self._spare.append(parser)

    def restock(self) -> None:
        while len(self._ready) < self._size:
            self._ready.append(new_parser(self._encoding))
        while len(self._spare) < self._spares:
            self._spare.append(new_parser(self._encoding))

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def spare(self) -> int:
        return len(self._spare)


class HarmonyDecoder:
    """Feed sampled tokens one at a time; collect the events each produces."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        new_call_id: Callable[[], str] = new_call_id,
        *,
        parser: StreamableParser | None = None,
    ) -> None:
        """`parser`: a new one from `ParserStock` (made here when None)."""
        self._encoding = encoding
        self._new_call_id = new_call_id
        self._parser = new_parser(encoding) if parser is None else parser
        self._message_tokens: list[int] = []
        self._segment: _Segment | None = None
        self._next_index = 0
        self._n_messages = 0
        self._rejected: list[int] = []  # tokens after the parser gave up
        self._error = ""
        self.reasoning_tokens = 0
        self.left_grammar = False  # the model wrote something harmony's grammar does not allow
        self._ahead: _Ahead | None = None  # tokens parsed ahead (`expect`)

    def expect(self, tokens: Sequence[int], stock: ParserStock) -> None:
        """Parse `tokens`, those the generation most likely starts with, ahead of them (while
        the prompt is evaluated), on a spare parser of the stock's (none ready: nothing is
        parsed ahead). The first tokens fed then take that parse if they are these — this
        decoder's own parser, unused, goes back to the stock — and are fed as always if not.
        Only before the first token: a harmony header's first tokens are the parser's slowest
        (0.19 ms for the first one after a prefill, against 0.03 for a text token)."""
        if self._message_tokens or self._n_messages or self._rejected or not tokens:
            return
        parser = stock.take_spare()
        if parser is None:
            return
        ahead = HarmonyDecoder(self._encoding, self._new_call_id, parser=parser)
        events = [event for token in tokens for event in ahead._feed(token)]
        if not ahead._rejected:
            self._ahead = _Ahead(tuple(tokens), ahead, events, stock)

    def feed(self, token: int) -> list[DecoderEvent]:
        ahead = self._ahead
        if ahead is None:
            return self._feed(token)
        if token == ahead.tokens[ahead.matched]:
            ahead.matched += 1
            if ahead.matched < len(ahead.tokens):
                return []
            self._ahead = None
            ahead.stock.give_back(self._parser)
            self._adopt(ahead.decoder)
            return ahead.events
        return [*self._unmatched(), *self._feed(token)]

    def _unmatched(self) -> list[DecoderEvent]:
        """Drop the parse ahead; the tokens that matched it so far go to this decoder's own
        parser."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return []
        return [event for token in ahead.tokens[: ahead.matched] for event in self._feed(token)]

    def _adopt(self, other: HarmonyDecoder) -> None:
        """Take over the state of a decoder that parsed this generation's tokens so far."""
        self._parser = other._parser
        self._message_tokens = other._message_tokens
        self._segment = other._segment
        self._next_index = other._next_index
        self._n_messages = other._n_messages
        self._rejected = other._rejected
        self._error = other._error
        self.reasoning_tokens = other.reasoning_tokens
        self.left_grammar = other.left_grammar

    def _feed(self, token: int) -> list[DecoderEvent]:
        if self._rejected:
            self._rejected.append(token)
            return []
        self._message_tokens.append(token)
        try:
            self._parser.process(token)
            delta = self._parser.last_content_delta
        except HarmonyError as exc:
            return self._reject(token, str(exc))
        events: list[DecoderEvent] = []
        if token == MESSAGE and self._segment is None:
            events.append(self._open(self._current_header()))
        if delta and self._segment is not None:
            events.append(self._append(self._segment, delta))
        if token in TERMINATORS:
            events.extend(self._message_ended())
        return events

    def finish(self) -> list[DecoderEvent]:
        """Close whatever is open when generation stops; call once, after the last feed."""
        # a generation that ended inside the tokens expected: those that came are this one's
        return [*self._unmatched(), *self._finish()]

    def _finish(self) -> list[DecoderEvent]:
        if self._rejected:
            return [self._warning(self._error, self._rejected)]
        if self._segment is not None:
            return [self._close(complete=False)]
        if self._message_tokens:
            return [self._warning("generation ended inside a message header", [])]
        return []

    def _current_header(self) -> tuple[str | None, str | None, str | None]:
        parser = self._parser
        return parser.current_channel, parser.current_recipient, parser.current_content_type

    def _open(self, header: tuple[str | None, str | None, str | None]) -> SegmentStart:
        channel, recipient, content_type = header
        kind = segment_kind(channel, recipient)
        call_id = self._new_call_id() if kind is SegmentKind.TOOL_CALL else None
        start = SegmentStart(self._next_index, kind, channel, recipient, content_type, call_id)
        self._next_index += 1
        self._segment = _Segment(start)
        return start

    @staticmethod
    def _append(segment: _Segment, text: str) -> SegmentDelta:
        segment.parts.append(text)
        return SegmentDelta(segment.start.index, segment.start.kind, text)

    def _message_ended(self) -> list[DecoderEvent]:
        messages = self._parser.messages
        if len(messages) <= self._n_messages:
            self.left_grammar = True
            return [self._warning("a terminator token ended no message", [])]
        self._n_messages = len(messages)
        message = messages[-1]
        events: list[DecoderEvent] = []
        if self._segment is None:  # header without <|message|>: the lenient parser recovered
            self.left_grammar = True
            events.append(self._open((message.channel, message.recipient, message.content_type)))
            text = _text_of(message)
            if text and self._segment is not None:
                events.append(self._append(self._segment, text))
        events.append(self._close(complete=True))
        return events

    def _close(self, *, complete: bool) -> SegmentEnd:
        assert self._segment is not None
        start = self._segment.start
        tokens = tuple(self._message_tokens)
        if start.kind is SegmentKind.REASONING:
            self.reasoning_tokens += len(tokens)
        end = SegmentEnd(
            index=start.index,
            kind=start.kind,
            text="".join(self._segment.parts),
            tokens=tokens,
            complete=complete,
            channel=start.channel,
            recipient=start.recipient,
            content_type=start.content_type,
            call_id=start.call_id,
        )
        self._segment = None
        self._message_tokens = []
        return end

    def _reject(self, token: int, error: str) -> list[DecoderEvent]:
        reason = error.split(":", 1)[0]  # after a colon harmony quotes the model's text
        log.warning("model output left the harmony format: %s", reason)
        self.left_grammar = True
        self._error = f"model output left the harmony format: {reason}"
        self._message_tokens.pop()
        self._rejected = [token]
        return [self._close(complete=False)] if self._segment is not None else []

    def _warning(self, message: str, tokens: list[int]) -> DecodeWarning:
        pending = self._message_tokens + tokens if not self._rejected else tokens
        text = self._encoding.decode(pending) if pending else ""
        self._message_tokens = []
        return DecodeWarning(message=message, text=text, tokens=tuple(pending))


def _text_of(message: Message) -> str:
    return "".join(getattr(part, "text", "") for part in message.content)
