"""POST /v1/chat/completions: streaming (SSE chunks) and non-streaming, one event stream (one
per choice when `n` > 1: server/api/chat/choices.py)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.chat.adapter import WIRE_NAMES, generation_options, reasoning_view, to_transcript
from server.api.chat.choices import folded, merged_stream
from server.api.chat.emitter import ChatEmitter, ChatEvent, ChatFailed, ChunkFactory, encode, fold
from server.api.chat.schemas import ChatCompletionRequest
from server.api.model_choice import chosen, loading_notice
from server.api.response_fields import new_id, now
from server.api.sse import sse_response
from server.api.stream_run import StreamRun, respond_all
from server.api.unicode_body import UnicodeRoute
from server.contracts.errors import InvalidRequest, ServerError
from server.contracts.transcript import Transcript
from server.core.generation import GenerationOptions, Generator
from server.core.prepared import Prepared
from server.ops.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter(route_class=UnicodeRoute)  # no lone surrogate in a body (unicode_body.py)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    settings: Settings = request.app.state.settings
    served = chosen(request, body.model)
    generator = served.generator
    transcript = to_transcript(body, settings.reasoning_effort, settings.today())
    shown = reasoning_view(body, settings.reasoning_visibility)
    n = body.n or 1
    slots = generator.engine.load.slots
    if n > slots:
        raise InvalidRequest(
            f"n={n} asks for more choices than the server generates side by side ({slots}; "
            "--n-slots)",
            param="n",
        )
    options = generation_options(body, shown.summary)
    try:
        prepared = _prepare_choices(generator, transcript, options, n)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    chat_id = new_id("chatcmpl-")
    created, model = now(), served.echo(body.model)
    emitters = [
        ChatEmitter(
            ChunkFactory(chat_id, created, model, index),
            include_reasoning=shown.raw,
            reasoning_content=settings.reasoning_content,
            summaries=shown.summary is not None,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            logprobs=generator.token_bytes if body.logprobs else None,
            reasoning_logprobs=bool(body.reasoning_logprobs),
        )
        for index in range(n)
    ]
    runs: list[StreamRun[ChatEvent]] = [
        StreamRun(source, emitter, name=f"completion {chat_id}")
        for source, emitter in zip(prepared, emitters, strict=True)
    ]
    if n == 1:
        run, emitter = runs[0], emitters[0]
        if body.stream:
            return loading_notice(await run.stream(encode, keepalive_s=None), served)
        return await run.respond(request, lambda events: fold(events, emitter))
    if body.stream:

        async def encoded() -> AsyncIterator[bytes]:
            async for event in merged_stream([r.events() for r in runs], emitters):
                yield encode(event)

        return loading_notice(sse_response(encoded()), served)
    return await respond_all(
        request,
        runs,
        lambda events: folded(events, emitters),
        failed=lambda event: isinstance(event, ChatFailed),
    )


def _prepare_choices(
    generator: Generator, transcript: Transcript, options: GenerationOptions, n: int
) -> list[Prepared]:
    """One admitted generation per choice (a seed, the request's or the server's --seed, gives
    each choice its own: seed + index)."""
    prepared: list[Prepared] = []
    first = options.seed if options.seed is not None else generator.defaults.seed
    try:
        for index in range(n):
            seed = None if first is None else first + index
            prepared.append(generator.prepare(transcript, dataclasses.replace(options, seed=seed)))
    except BaseException:
        for done in prepared:
            if done.ticket is not None:
                done.ticket.release()
        raise
    return prepared
