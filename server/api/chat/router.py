"""POST /v1/chat/completions: streaming (SSE chunks) and non-streaming, one event stream."""

from __future__ import annotations

import datetime
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.api.chat.adapter import (
    WIRE_NAMES,
    generation_options,
    reasoning_view,
    to_transcript,
)
from server.api.chat.output import ChatEmitter, ChunkFactory, fold
from server.api.chat.schemas import ChatCompletionRequest, Delta
from server.api.disconnect import ClientGone, consume_while_connected
from server.api.response_fields import new_id, now
from server.api.sse import DONE, sse_data, sse_response
from server.contracts.errors import ServerError, error_envelope
from server.contracts.events import FinishReason
from server.core.generation import Generator, Prepared
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
    emitter = ChatEmitter(
        include_reasoning=shown.raw,
        reasoning_content=settings.reasoning_content,
        summaries=shown.summary is not None,
    )
    factory = ChunkFactory(new_id("chatcmpl-"), now(), body.model or request.app.state.model_name)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _stream(prepared, emitter, factory, include_usage)
        return sse_response(chunks)
    deltas: list[Delta] = []
    try:
        await consume_while_connected(
            request, prepared.events(), lambda event: deltas.extend(emitter.deltas(event))
        )
    except ClientGone:
        return Response(status_code=499)  # nobody is listening; the generation was cancelled
    finished = emitter.finished
    if finished is not None and finished.reason is FinishReason.ERROR:
        raise ServerError(f"generation failed: {finished.error}")
    return JSONResponse(fold(deltas, emitter, factory))


async def _stream(
    prepared: Prepared, emitter: ChatEmitter, factory: ChunkFactory, include_usage: bool
) -> AsyncIterator[bytes]:
    yield sse_data(factory.chunk(Delta(role="assistant", content="")))
    async for event in prepared.events():
        for delta in emitter.deltas(event):
            yield sse_data(factory.chunk(delta))
    finished = emitter.finished
    if finished is None or finished.reason is FinishReason.CANCELLED:
        return
    if finished.reason is FinishReason.ERROR:
        yield sse_data(error_envelope(f"generation failed: {finished.error}", "server_error"))
        return
    yield sse_data(factory.chunk(Delta(), emitter.finish_reason))
    if include_usage:
        yield sse_data(factory.usage_chunk(finished))
    yield DONE
