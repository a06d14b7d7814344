"""POST /v1/chat/completions: streaming (SSE chunks) and non-streaming, one event stream."""

from __future__ import annotations

import datetime
import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api.chat.adapter import (
    WIRE_NAMES,
    generation_options,
    reasoning_view,
    to_transcript,
)
from server.api.chat.output import ChatEmitter, ChatEvent, ChunkFactory, encode, fold
from server.api.chat.schemas import ChatCompletionRequest
from server.api.response_fields import new_id, now
from server.api.stream_run import StreamRun
from server.contracts.errors import ServerError
from server.core.generation import Generator
from server.ops.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    settings: Settings = request.app.state.settings
    generator: Generator = request.app.state.generator
    today = datetime.date.today().isoformat()
    transcript = to_transcript(body, settings.reasoning_effort, today)
    shown = reasoning_view(body, settings.reasoning_visibility)
    try:
        prepared = generator.prepare(transcript, generation_options(body, shown.summary))
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    factory = ChunkFactory(new_id("chatcmpl-"), now(), body.model or request.app.state.model_name)
    emitter = ChatEmitter(
        factory,
        include_reasoning=shown.raw,
        reasoning_content=settings.reasoning_content,
        summaries=shown.summary is not None,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        logprobs=generator.token_bytes if body.logprobs else None,
        reasoning_logprobs=bool(body.reasoning_logprobs),
    )
    run: StreamRun[ChatEvent] = StreamRun(prepared, emitter, name=f"completion {factory.id}")
    if body.stream:
        return run.stream(encode, keepalive_s=None)
    return await run.respond(request, lambda events: fold(events, emitter))
