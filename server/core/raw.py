"""Raw completions: prompt token ids in, the model's next tokens out, no harmony on either side.

What `/v1/completions` runs: the prompt is evaluated as given (no chat rendering, no steering,
no history), the engine's tokens come back as they are, with their logprobs where asked, and
with `prompt_logprobs` each prompt token's (loglikelihood scoring: lm-evaluation-harness).
Admission, the context check and the metrics report are the same as for every generation.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from server.contracts.errors import (
    ContextLengthExceeded,
    EngineUnavailable,
    InvalidRequest,
    RequestField,
    ServerBusy,
)
from server.core.admission import Ticket
from server.core.generation import SEED_RANGE, GenerationOptions, Generator, finished_event
from server.engine.base import EngineResult, SamplingParams, TokenChunk, TokenStream
from server.harmony.tokens import END_OF_TEXT, FIRST_SPECIAL


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
    """Validate and admit one raw generation; raises like Generator.prepare()."""
    engine = generator.engine
    if engine.failure is not None:
        raise EngineUnavailable(f"The server cannot generate: {engine.failure}")
    check_prompt(prompt_tokens, engine.info.n_vocab, specials=specials)
    n_ctx = engine.info.n_ctx
    room = n_ctx - len(prompt_tokens)
    if room <= 0:
        raise ContextLengthExceeded(len(prompt_tokens), n_ctx, field=RequestField.CONVERSATION)
    wanted = options.max_tokens
    if wanted is not None and wanted < 0:
        raise InvalidRequest("max tokens must not be negative", field=RequestField.MAX_TOKENS)
    defaults = generator.defaults
    params = SamplingParams(
        max_tokens=room if wanted is None else min(wanted, room),
        temperature=defaults.temperature if options.temperature is None else options.temperature,
        top_p=defaults.top_p if options.top_p is None else options.top_p,
        top_k=defaults.top_k if options.top_k is None else options.top_k,
        min_p=defaults.min_p,
        seed=None if options.seed is None else options.seed % SEED_RANGE,
        stop_tokens=frozenset([*generator.encoding.stop_tokens(), END_OF_TEXT]),
        logprobs=options.logprobs,
        prompt_logprobs=prompt_logprobs,
    )
    ticket = generator.admission.try_acquire()
    if ticket is None:
        raise ServerBusy(generator.admission.waiting)
    raw = RawGeneration(generator, prompt_tokens, params, ticket)
    weakref.finalize(raw, ticket.release)
    return raw


@dataclass
class RawGeneration:
    """One admitted raw generation; iterate `chunks()` once, then read `result`."""

    generator: Generator
    prompt_tokens: list[int]
    params: SamplingParams
    ticket: Ticket
    _stream: TokenStream | None = None

    async def chunks(self) -> AsyncGenerator[TokenChunk, None]:
        """The engine's chunks; stopping early (`stop()`, or leaving) cancels the engine."""
        stream = self.generator.engine.submit(self.prompt_tokens, self.params)
        self._stream = stream
        try:
            async for chunk in stream.paced(self.generator.stream_interval_s):
                yield chunk
        finally:
            stream.cancel()  # no-op once finished
            self.ticket.release()

    async def result(self, *, stopped: str | None = None) -> EngineResult:
        """How it ended (waits for the engine after an early stop); reported to the metrics."""
        assert self._stream is not None, "chunks() was not iterated"
        async for _ in self._stream:  # drains what is left once cancelled
            pass
        result = self._stream.result
        if self.generator.on_finished is not None:
            self.generator.on_finished(finished_event(result, 0, stopped=stopped))
        return result
