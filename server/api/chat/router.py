"""POST /v1/chat/completions: streaming (SSE chunks) and non-streaming, one event stream."""

from __future__ import annotations

import datetime
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from server.api.chat.adapter import generation_options, to_transcript, view
from server.api.chat.output import ChatTranslator, ChunkFactory, fold
from server.api.chat.schemas import ChatCompletionRequest, Delta
from server.api.common import new_id, now
from server.api.disconnect import ClientGone, consume_while_connected
from server.api.sse import DONE, sse_data
from server.config import Settings
from server.errors import ServerError, error_envelope
from server.events import FinishReason
from server.generation import Generator, Prepared

log = logging.getLogger(__name__)
router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    settings: Settings = request.app.state.settings
    generator: Generator = request.app.state.generator
    today = datetime.date.today().isoformat()
    transcript = to_transcript(body, settings.reasoning_effort, today)
    shown = view(body, settings.reasoning_visibility)
    prepared = generator.prepare(transcript, generation_options(body, shown.summary))
    translator = ChatTranslator(
        include_reasoning=shown.raw,
        reasoning_content=settings.reasoning_content,
        summaries=shown.summary is not None,
    )
    factory = ChunkFactory(new_id("chatcmpl-"), now(), body.model or request.app.state.model_name)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _stream(prepared, translator, factory, include_usage)
        return StreamingResponse(chunks, media_type="text/event-stream", headers=SSE_HEADERS)
    deltas: list[Delta] = []
    try:
        await consume_while_connected(
            request, prepared.events(), lambda event: deltas.extend(translator.deltas(event))
        )
    except ClientGone:
        return Response(status_code=499)  # nobody is listening; the generation was cancelled
    finished = translator.finished
    if finished is not None and finished.reason is FinishReason.ERROR:
        raise ServerError(f"generation failed: {finished.error}")
    return JSONResponse(fold(deltas, translator, factory))


async def _stream(
    prepared: Prepared, translator: ChatTranslator, factory: ChunkFactory, include_usage: bool
) -> AsyncIterator[bytes]:
    yield sse_data(factory.chunk(Delta(role="assistant", content="")))
    async for event in prepared.events():
        for delta in translator.deltas(event):
            yield sse_data(factory.chunk(delta))
    finished = translator.finished
    if finished is None or finished.reason is FinishReason.CANCELLED:
        return
    if finished.reason is FinishReason.ERROR:
        yield sse_data(error_envelope(f"generation failed: {finished.error}", "server_error"))
        return
    yield sse_data(factory.chunk(Delta(), translator.finish_reason))
    if include_usage:
        yield sse_data(factory.usage_chunk(finished))
    yield DONE
