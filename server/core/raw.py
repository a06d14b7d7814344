"""Raw completions: prompt token ids in, the model's next tokens out, no harmony on either side.

What `/v1/completions` runs: the prompt is evaluated as given (no chat rendering, no steering,
no history), and the engine's tokens come back as the text of one FINAL segment: `SegmentStart`,
a `SegmentDelta` per engine chunk (complete characters, each carrying the logprobs of its tokens
where asked: every generated token's, the stop token's too, although its text is not part of the
completion), `SegmentEnd`, then `Finished`. The text is cut at the request's stop strings by the
same filter as a chat answer's (server.core.stop_strings); the tokens after the cut are not
reported. With `prompt_logprobs`, each prompt token's are on `result` once the events ended
(loglikelihood scoring: lm-evaluation-harness). Admission, the context check, the sampling
parameters and the metrics report are every generation's (Generator.admit, Generator.sampling),
and so is the engine loop (server.core.rounds); what raw text makes of its chunks is `_RawReader`'s.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from itertools import zip_longest

from server.contracts.errors import InvalidRequest, RequestField
from server.contracts.events import (
    Finished,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
    TokenLogprob,
)
from server.core.admission import Ticket
from server.core.finish import finished_event
from server.core.generation import GenerationOptions, Generator
from server.core.rounds import Rounds
from server.core.stop_strings import StopStrings
from server.engine.base import EngineResult, SamplingParams, TokenChunk
from server.harmony.token_bytes import TokenBytes
from server.harmony.tokens import END_OF_TEXT, FIRST_SPECIAL

SEGMENT = 0  # a raw generation is one segment


def check_prompt(tokens: Sequence[int], n_vocab: int, *, specials: bool) -> None:
    """Raise InvalidRequest for ids outside the vocabulary, or harmony specials not allowed."""
    if not tokens:
        raise InvalidRequest("the prompt is empty", field=RequestField.CONVERSATION)
    for token in tokens:
        if not 0 <= token < n_vocab:
            raise InvalidRequest(
                f"token id {token} is outside the vocabulary (0..{n_vocab - 1})",
                field=RequestField.CONVERSATION,
            )
        if token >= FIRST_SPECIAL and not specials:
            raise InvalidRequest(
                f"token id {token} is a harmony special token; send allow_special_tokens: true "
                "to use special tokens in a raw prompt",
                field=RequestField.CONVERSATION,
            )


def prepare_raw(
    generator: Generator,
    prompt_tokens: list[int],
    options: GenerationOptions,
    *,
    prompt_logprobs: bool = False,
    specials: bool = False,
) -> RawGeneration:
    """Validate and admit one raw generation; raises like Generator.prepare(). `options.stop`
    cuts its text; max tokens 0 evaluates the prompt only."""

    def make(ticket: Ticket) -> RawGeneration:
        check_prompt(prompt_tokens, generator.engine.info.n_vocab, specials=specials)
        stop_tokens = frozenset([*generator.encoding.stop_tokens(), END_OF_TEXT])
        params = generator.sampling(
            options,
            len(prompt_tokens),
            stop_tokens=stop_tokens,
            prompt_only=True,
            prompt_logprobs=prompt_logprobs,
        )
        return RawGeneration(
            generator.rounds, generator.token_bytes, prompt_tokens, params, options.stop, ticket
        )

    return generator.admit(make)


class RawText:
    """The completion's text as its tokens come: bytes joined across tokens (a character may
    span several), stop tokens left out of the text, cut at the first stop string (a possible
    stop string's start held back until the next tokens show whether it is one)."""

    def __init__(self, vocab: TokenBytes, stops: Sequence[str], stop_tokens: frozenset[int]):
        self._vocab = vocab
        self._stops = StopStrings(stops)
        self._stop_tokens = stop_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._decoded = 0  # characters decoded so far, before any cut
        self._scores: list[tuple[int, TokenLogprob]] = []  # not yet sent, with their starts
        self.text = ""  # what was sent

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stops.matched

    def feed(
        self, tokens: Sequence[int], logprobs: Sequence[TokenLogprob | None] = ()
    ) -> SegmentDelta | None:
        """The delta for these tokens (None if it has neither text nor logprobs); nothing once
        a stop string appeared: the tokens from the one that starts it on are not reported."""
        if self._stops.hit:
            return None
        decoded = []
        for token, score in zip_longest(tokens, logprobs[: len(tokens)]):
            if score is not None:
                self._scores.append((self._decoded, score))
            if token not in self._stop_tokens:
                piece = self._decoder.decode(self._vocab.of(token))
                self._decoded += len(piece)
                decoded.append(piece)
        return self._delta("".join(decoded))

    def finish(self) -> SegmentDelta | None:
        """What is left once the engine stopped (a held-back text, a cut character, the
        logprobs of the tokens after the last character: the stop token's)."""
        if self._stops.hit:
            return None
        rest = self._decoder.decode(b"", final=True)
        self._decoded += len(rest)
        return self._delta(rest, final=True)

    def _delta(self, text: str, *, final: bool = False) -> SegmentDelta | None:
        """The text the stop strings let pass, with the logprobs of the tokens it starts."""
        passed = self._stops.filter(SegmentDelta(SEGMENT, SegmentKind.FINAL, text))
        if final and not self._stops.hit:
            passed += self._stops.filter(SegmentEnd(SEGMENT, SegmentKind.FINAL, "", ()))
        sent = "".join(e.text for e in passed if isinstance(e, SegmentDelta))
        self.text += sent
        end = len(self.text)  # a token whose text is held back waits with its logprobs
        flush = final and not self._stops.hit  # the end: the tokens after the last character
        ready = [score for start, score in self._scores if flush or start < end]
        self._scores = (
            []
            if final or self._stops.hit
            else [(start, score) for start, score in self._scores if start >= end]
        )
        if not sent and not ready:
            return None
        return SegmentDelta(SEGMENT, SegmentKind.FINAL, sent, tuple(ready))


@dataclass
class RawGeneration:
    """One admitted raw generation; iterate `events()` once."""

    rounds: Rounds
    vocab: TokenBytes
    prompt_tokens: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    ticket: Ticket
    result: EngineResult | None = None  # how it ended, once its events did

    async def events(self) -> AsyncGenerator[GenerationEvent, None]:
        """The completion as one FINAL segment, then Finished; leaving early cancels the engine
        (still reported to the metrics once the engine lets go)."""
        reader = _RawReader(self, RawText(self.vocab, self.stop, self.params.stop_tokens))
        try:
            stream = self.rounds.submit(self.prompt_tokens, self.params)
        except BaseException:
            self.ticket.release()
            raise
        opening = (SegmentStart(SEGMENT, SegmentKind.FINAL, None),)
        async with aclosing(self.rounds.run(stream, reader, opening)) as events:
            async for event in events:
                yield event


class _RawReader:
    """A raw round's chunks -> one FINAL segment's events (server.core.rounds.Reader); the
    admission place is given back once the chunks are no longer read."""

    def __init__(self, generation: RawGeneration, text: RawText) -> None:
        self._generation = generation
        self._text = text

    @property
    def stop(self) -> str | None:
        return self._text.matched

    def feed(self, chunk: TokenChunk) -> list[GenerationEvent]:
        delta = self._text.feed(chunk, chunk.logprobs)
        return [] if delta is None else [delta]  # none: held back, the next chunk at once

    def let_go(self, *, read: bool) -> None:
        self._generation.ticket.release()

    def tail(self) -> Iterator[GenerationEvent]:
        text = self._text
        if text.matched is None:
            rest = text.finish()
            if rest is not None:
                yield rest
        yield SegmentEnd(SEGMENT, SegmentKind.FINAL, text.text, (), complete=text.matched is None)

    def finished(self, result: EngineResult, stop: str | None) -> Finished:
        self._generation.result = result
        return finished_event(result, 0, stopped=stop)
