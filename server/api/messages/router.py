"""POST /v1/messages (streaming and not, one event stream) and POST /v1/messages/count_tokens.

Claude Code posts to `/v1/messages?beta=true` with `anthropic-version` and `anthropic-beta`
headers: the query and the headers are accepted and need nothing. Everything that can be refused
is refused before the first byte (bad input 400, a prompt that does not fit 400 worded as
Anthropic words it, a full queue 429), in Anthropic's error envelope (server.api.error_handlers);
a failure after that ends the stream with an `error` event.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.api.messages import adapter, schemas
from server.api.messages.emitter import MessagesEmitter, fold
from server.api.messages.errors import prompt_too_long
from server.api.messages.signature import ThinkingSigner
from server.api.model_choice import chosen, loading_notice
from server.api.response_fields import new_id
from server.api.sse import sse_typed
from server.api.stream_run import Ended, StreamRun
from server.api.unicode_body import UnicodeRoute
from server.contracts.errors import ContextLengthExceeded, ServerError
from server.contracts.transcript import Transcript
from server.ops.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter(route_class=UnicodeRoute)  # no lone surrogate in a body (unicode_body.py)


@dataclass
class MessagesState:
    """What /v1/messages keeps for the server's life; lives on app.state.messages."""

    signer: ThinkingSigner  # its key is kept in the state directory: it outlives a restart
    ping_s: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings, signer: ThinkingSigner) -> MessagesState:
        return cls(signer=signer, ping_s=settings.messages_ping_s)


@router.post("/v1/messages", response_model=None)
async def create_message(body: schemas.MessagesRequest, request: Request) -> Response:
    settings: Settings = request.app.state.settings
    served = chosen(request, body.model)
    generator = served.generator
    state: MessagesState = request.app.state.messages
    shown = adapter.reasoning_view(body, settings.reasoning_visibility)
    try:
        transcript = _transcript(body, settings, state)
        prepared = generator.prepare(transcript, adapter.generation_options(body, shown.summary))
    except ContextLengthExceeded as exc:
        raise prompt_too_long(exc) from None
    except ServerError as exc:
        raise exc.named(adapter.WIRE_NAMES) from None
    emitter = MessagesEmitter(
        new_id("msg_"),
        served.echo(body.model),
        input_tokens=len(prepared.prompt_tokens),
        signer=state.signer,
        message_start=list(generator.renderer.assistant_start),
        view=shown,
        thinking_text=adapter.thinking_text_shown(body),
    )
    run: StreamRun[schemas.StreamEvent] = StreamRun(
        prepared,
        emitter,
        name=f"message {emitter.message_id}",
        finish=partial(_log_usage, emitter.message_id),
    )
    if body.stream:
        return loading_notice(await run.stream(sse_typed, state.ping_s), served)
    return await run.respond(request, _body)


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_tokens(body: schemas.CountTokensRequest, request: Request) -> Response:
    """The prompt's length in tokens, rendered exactly as /v1/messages would render it."""
    settings: Settings = request.app.state.settings
    generator = chosen(request, body.model).generator
    state: MessagesState = request.app.state.messages
    try:
        transcript = _transcript(body, settings, state)
    except ServerError as exc:
        raise exc.named(adapter.WIRE_NAMES) from None
    count = schemas.TokenCount(input_tokens=generator.count_tokens(transcript))
    return JSONResponse(count.model_dump(mode="json"))


def _transcript(
    body: schemas.CountTokensRequest, settings: Settings, state: MessagesState
) -> Transcript:
    return adapter.to_transcript(body, settings.reasoning_effort, settings.today(), state.signer)


def _body(events: list[schemas.StreamEvent]) -> dict[str, Any]:
    """The non-streaming body; an error event raises: a 500 in Anthropic's envelope."""
    return fold(events).model_dump(mode="json")


async def _log_usage(message_id: str, last: list[schemas.StreamEvent], _: list[Ended]) -> None:
    """Log what the message cost (its `message_delta`; a failed one has none)."""
    for event in last:
        if not isinstance(event, schemas.MessageDelta):
            continue
        usage = event.usage
        log.info(
            "message %s: %s input tokens evaluated, %s read from the cache, %s output tokens",
            message_id,
            usage.input_tokens,
            usage.cache_read_input_tokens,
            usage.output_tokens,
        )
