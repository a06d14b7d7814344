"""POST /v1/completions: raw prompts (text or token ids), echo, logprobs, streaming.

Each prompt is one choice, generated side by side in the batch (server/core/raw.py), its events
through the shared stream tail (server/api/stream_run.py) with the Completions emitter
(emitter.py): a client that leaves a non-streaming request gets 499 and its generations stop,
the first choice that fails stops the others, a stream that fails ends with an error event and
[DONE]. With
`echo`, the prompt comes back before the completion, and with `logprobs` each prompt token's
logprob too (the first is null: nothing comes before it): what loglikelihood evaluation reads
(null also for prompt tokens never evaluated: a request that gave way for KV room part way
through its prompt ends with finish_reason `length`).
`max_tokens: 0` evaluates the prompt only. Text is cut at a `stop` string; the engine's stop
token (<|return|>, <|call|>, <|end|>, <|endoftext|>) ends the completion: it is not part of the
text, but is listed with its logprob (every generated token is; clients such as lm-eval count on
`max_tokens` tokens after the prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.completions.adapter import (
    WIRE_NAMES,
    check_supported,
    generation_options,
    prompt_tokens,
)
from server.api.completions.emitter import (
    CompletionEvent,
    CompletionsEmitter,
    Identity,
    encode,
    failed,
)
from server.api.completions.schemas import Completion, CompletionRequest, CompletionUsage
from server.api.logprobs import LegacyLogprobs, TextOffsets, legacy
from server.api.model_choice import chosen, loading_notice
from server.api.response_fields import new_id, now
from server.api.stream_run import StreamRun, respond_all
from server.api.unicode_body import UnicodeRoute
from server.contracts.errors import ServerError
from server.contracts.events import TokenLogprob
from server.core.generation import Generator
from server.core.raw import RawGeneration, prepare_raw
from server.harmony.token_bytes import TokenBytes

router = APIRouter(route_class=UnicodeRoute)  # no lone surrogate in a body (unicode_body.py)


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    served = chosen(request, body.model)
    generator = served.generator
    try:
        check_supported(body)
        prompts = prompt_tokens(body, generator.encoding)
        runs = _prepare(generator, prompts, body)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    vocab = generator.token_bytes
    identity = Identity(new_id("cmpl-"), now(), served.echo(body.model))
    prefixes = [vocab_text(vocab, run.prompt_tokens) if body.echo else "" for run in runs]
    emitters = [
        CompletionsEmitter(
            identity,
            index,
            vocab,
            len(run.prompt_tokens),
            n_top=body.logprobs,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            offset=len(prefix),
        )
        for index, (run, prefix) in enumerate(zip(runs, prefixes, strict=True))
    ]
    streams: list[StreamRun[CompletionEvent]] = [
        StreamRun(run, emitter, name=f"completion {identity.id}")
        for run, emitter in zip(runs, emitters, strict=True)
    ]
    if body.stream:
        return loading_notice(await streams[0].stream(encode, keepalive_s=None), served)

    def folded(events: list[list[CompletionEvent]]) -> Completion:
        return _body(identity, runs, emitters, prefixes, events)

    return await respond_all(request, streams, folded, failed=failed)


def _prepare(
    generator: Generator, prompts: list[list[int]], body: CompletionRequest
) -> list[RawGeneration]:
    options = generation_options(body)
    scored = body.echo and body.logprobs is not None
    runs: list[RawGeneration] = []
    try:
        for tokens in prompts:
            runs.append(
                prepare_raw(
                    generator,
                    tokens,
                    options,
                    prompt_logprobs=scored,
                    specials=body.allow_special_tokens,
                )
            )
    except BaseException:
        for run in runs:
            run.ticket.release()
        raise
    return runs


def _body(
    identity: Identity,
    runs: Sequence[RawGeneration],
    emitters: Sequence[CompletionsEmitter],
    prefixes: Sequence[str],
    events: list[list[CompletionEvent]],
) -> Completion:
    """The non-streaming body: every choice folded (a failed one raises its error)."""
    for choice_events in events:
        error = next((e for e in choice_events if failed(e)), None)
        if isinstance(error, dict):
            raise ServerError(error["error"]["message"])
    choices = []
    for run, emitter, prefix in zip(runs, emitters, prefixes, strict=True):
        echoed = None
        if prefix and emitter.n_top is not None and run.result is not None:
            echoed = _prompt_logprobs(run, emitter.vocab, emitter.n_top)
        choices.append(emitter.choice(prefix, echoed))
    return Completion(
        id=identity.id,
        object="text_completion",
        created=identity.created,
        model=identity.model,
        choices=choices,
        usage=_usage([emitter.usage() for emitter in emitters]),
    )


def _prompt_logprobs(run: RawGeneration, vocab: TokenBytes, n_top: int) -> LegacyLogprobs:
    """The echoed prompt's logprobs; null for the tokens never evaluated (the request gave way
    for KV room part way through its prompt)."""
    assert run.result is not None
    scores: list[TokenLogprob | None] = list(run.result.prompt_logprobs)
    scores += [None] * (len(run.prompt_tokens) - len(scores))
    return legacy(run.prompt_tokens, scores, vocab, n_top=n_top, offsets=TextOffsets(vocab))


def vocab_text(vocab: TokenBytes, tokens: Sequence[int]) -> str:
    return b"".join(vocab.of(t) for t in tokens).decode("utf-8", errors="replace")


def _usage(usages: Sequence[CompletionUsage]) -> CompletionUsage:
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    return CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details={
            "cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        },
    )
