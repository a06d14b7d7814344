"""POST /v1/responses (streaming and not, one event stream), GET and DELETE /v1/responses/{id},
POST /v1/responses/input_tokens (the prompt's length, counted as create would render it),
POST /v1/responses/compact (the conversation summarized by the model, server.api.responses.compact).

`open_response` makes a response ready to run; the WebSocket on the same path (socket.py) runs
its responses through it too.

Everything that can be refused is refused before the first byte: an unknown
previous_response_id (404), bad input (400), a prompt that does not fit (400,
context_length_exceeded). A stream then always ends with exactly one terminal event.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.api.model_choice import Served, chosen, loading_notice
from server.api.response_fields import new_id, now
from server.api.responses.adapter import (
    WIRE_NAMES,
    generation_options,
    output_items,
    reasoning_view,
    to_conversation,
    to_transcript,
    wants_logprobs,
)
from server.api.responses.builtin import BuiltinSetup, setup_builtin
from server.api.responses.compact import compacted, summary_transcript
from server.api.responses.emitter import ResponsesEmitter, fold
from server.api.responses.items import ItemKind
from server.api.responses.mcp import (
    ApprovalIds,
    Approvals,
    McpSetup,
    approvals,
    listed_labels,
    setup_mcp,
)
from server.api.responses.schemas import (
    CompactedResponse,
    DeletedResponse,
    InputTokens,
    InputTokensDetails,
    MessageItem,
    OutputTokensDetails,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    StreamEvent,
)
from server.api.responses.store import ResponseStore, StoredResponse
from server.api.sse import SharedField
from server.api.stream_run import Ended, StreamRun
from server.api.unicode_body import UnicodeRoute
from server.contracts.errors import InvalidRequest, NotFound, ServerError
from server.contracts.events import ToolTarget
from server.contracts.transcript import Item, ToolChoice, Transcript
from server.core.generation import Generator
from server.core.prepared import Prepared
from server.core.tool_loop import ServerTools
from server.core.visibility import ReasoningView
from server.engine.base import SlotPin
from server.ops.settings import Settings
from server.tools.python.tool import container_id

log = logging.getLogger(__name__)
router = APIRouter(route_class=UnicodeRoute)  # no lone surrogate in a body (unicode_body.py)

MAX_PINNED_DATES = 1024


@dataclass
class ResponsesState:
    """What /v1/responses keeps across requests; lives on app.state.responses."""

    store: ResponseStore
    keepalive_s: float = 5.0
    approval_ids: ApprovalIds = field(default_factory=ApprovalIds)  # signs approval requests
    _dates: OrderedDict[str, str] = field(default_factory=OrderedDict)

    @classmethod
    def from_settings(cls, settings: Settings, key: bytes) -> ResponsesState:
        """`key`: the server's secret in its state directory (approval ids are signed under a
        key derived from it)."""
        store = ResponseStore(
            settings.responses_store_path,
            max_entries=settings.responses_store_max_entries,
            max_bytes=settings.responses_store_max_mb << 20,
        )
        return cls(store, settings.responses_keepalive_s, ApprovalIds(key))

    def conversation_date(
        self, cache_key: str | None, earlier: StoredResponse | None, today: str, *, pin: bool = True
    ) -> str:
        """The date in the system message, pinned per conversation so the prefix stays.

        A continuation keeps its stored date; requests that share a prompt_cache_key (Codex
        sends its thread id) keep the date of the first one, also past midnight. `pin`: False
        looks the date up without pinning it.
        """
        if earlier is not None and earlier.conversation_date:
            return earlier.conversation_date
        if not cache_key:
            return today
        if not pin:
            return self._dates.get(cache_key, today)
        date = self._dates.pop(cache_key, today)
        self._dates[cache_key] = date
        while len(self._dates) > MAX_PINNED_DATES:
            self._dates.popitem(last=False)
        return date


@dataclass(frozen=True)
class _Setup:
    """A request in the core's terms, as create, input_tokens and compact build it."""

    response_id: str
    earlier: StoredResponse | None
    date: str
    shown: ReasoningView
    builtin: BuiltinSetup
    mcp: McpSetup
    conversation_id: str
    decided: Approvals
    transcript: Transcript


async def _setup(
    body: ResponsesRequest,
    app_state: Any,
    *,
    pin_date: bool = True,
    own: StoredResponse | None = None,
) -> _Setup:
    """Everything the prompt is rendered from: the earlier conversation, the pinned date, the
    request's input and tools (MCP servers' listings, built-in tools), approvals decided.
    `pin_date`: False for a request that generates nothing (the date is looked up, not kept).
    `own`: a conversation the caller keeps itself (a socket's last response, also one not
    stored), which a previous_response_id naming it continues without the store."""
    settings: Settings = app_state.settings
    state: ResponsesState = app_state.responses
    if body.background:
        raise InvalidRequest(
            "background responses are not supported: each response runs in its request "
            "(stream it, or wait for the body)",
            param="background",
        )
    earlier = await _earlier(state, body.previous_response_id, own)
    date = state.conversation_date(body.prompt_cache_key, earlier, settings.today(), pin=pin_date)
    shown = reasoning_view(body, settings.reasoning_visibility)
    response_id = new_id("resp_")
    before = earlier.conversation if earlier is not None else ()
    builtin = setup_builtin(body, app_state.server_tools.tools)
    mcp = await setup_mcp(body, app_state.mcp, _listed(earlier, body))
    _check_labels(mcp, builtin)
    conversation_id = (earlier.conversation_id or earlier.id) if earlier else response_id
    decided = approvals(body, to_conversation(body, before), mcp, state.approval_ids)
    transcript = to_transcript(body, decided.conversation, settings.reasoning_effort, date)
    if mcp.tools:
        transcript = dataclasses.replace(transcript, tools=(*transcript.tools, *mcp.specs))
    if builtin.tools:
        transcript = dataclasses.replace(transcript, builtin_tools=builtin.specs)
    return _Setup(
        response_id, earlier, date, shown, builtin, mcp, conversation_id, decided, transcript
    )


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    served = chosen(request, body.model)
    run = await open_response(body, request.app.state, served)
    if body.stream:
        keepalive_s = request.app.state.responses.keepalive_s
        return loading_notice(await run.stream(SharedField("response"), keepalive_s), served)
    return await run.respond(request, _body)


async def open_response(
    body: ResponsesRequest,
    app_state: Any,
    served: Served,
    *,
    own: StoredResponse | None = None,
    remember: Callable[[StoredResponse], None] | None = None,
    pin: SlotPin | None = None,
) -> StreamRun[StreamEvent]:
    """A response of `served`'s model admitted and ready to run: everything that can be
    refused is refused here (ServerError) before its first event.

    `own`: as in `_setup`. `remember` is handed the finished response's record (its
    conversation, with the exact tokens), stored or not. `pin`: the conversation's claim on its
    engine slot (the socket's).
    """
    settings: Settings = app_state.settings
    generator = served.generator
    state: ResponsesState = app_state.responses
    setup = await _setup(body, app_state, own=own)
    response_id, shown, mcp, builtin = setup.response_id, setup.shown, setup.mcp, setup.builtin
    decided, transcript = setup.decided, setup.transcript
    options = generation_options(body, shown.summary)
    server_tools = _server_tools(
        mcp,
        builtin,
        settings,
        decided=decided,
        response_id=response_id,
        conversation_id=setup.conversation_id,
        max_calls=body.max_tool_calls,
    )
    try:
        prepared = generator.prepare(transcript, options, server_tools, pin=pin)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    base = _base_response(body, transcript, prepared, served.name, response_id=response_id)
    vocab = generator.token_bytes if wants_logprobs(body) else None
    emitter = ResponsesEmitter(
        base,
        view=shown,
        logprobs=vocab,
        call_kind=_call_kind(mcp, builtin) if server_tools is not None else None,
        ready=mcp.listings,
        container_id=container_id(setup.conversation_id) if "python" in builtin.tools else "",
        approval_id=state.approval_ids.issue,
        approved=decided.approved,
        reasoning_events=settings.responses_reasoning_events,
    )
    finisher = _Finisher(
        state,
        generator,
        decided.conversation,
        setup.date,
        store=base.store,
        conversation_id=setup.conversation_id,
        remember=remember,
    )
    return StreamRun(prepared, emitter, name=f"response {base.id}", finish=finisher)


@router.post("/v1/responses/input_tokens", response_model=None)
async def input_tokens(body: ResponsesRequest, request: Request) -> Response:
    """How many tokens the prompt of this request has: the prompt /v1/responses would render
    for the same body (instructions, tools, the earlier conversation), counted, not run."""
    served = chosen(request, body.model)
    generator = served.generator
    setup = await _setup(body, request.app.state, pin_date=False)
    try:
        count = generator.count_tokens(setup.transcript)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    return JSONResponse(InputTokens(input_tokens=count).model_dump(mode="json"))


@router.post("/v1/responses/compact", response_model=None)
async def compact_response(body: ResponsesRequest, request: Request) -> Response:
    """The conversation compacted by the model (server.api.responses.compact): its user
    messages and one `compaction` item with the model's summary; sent as the next request's
    input (with what follows), the conversation continues from the summary."""
    served = chosen(request, body.model)
    generator = served.generator
    setup = await _setup(body, request.app.state)
    if not setup.decided.conversation:
        raise InvalidRequest("there is no conversation to compact", param="input")
    transcript = summary_transcript(setup.transcript)
    options = dataclasses.replace(
        generation_options(body), tool_choice=ToolChoice(mode="none"), logprobs=None
    )
    try:
        prepared = generator.prepare(transcript, options)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    base = _base_response(body, transcript, prepared, served.name, response_id=setup.response_id)
    emitter = ResponsesEmitter(base, view=ReasoningView(raw=False, summary=None))
    run: StreamRun[StreamEvent] = StreamRun(prepared, emitter, name=f"compaction {base.id}")
    return await run.respond(request, partial(_compacted_body, setup.decided.conversation))


def _compacted_body(conversation: tuple[Item, ...], events: list[StreamEvent]) -> dict[str, Any]:
    """The compaction's body: the user messages and the summary the model wrote."""
    response = fold(events)
    if response.status != "completed" or response.usage is None:
        reason = response.error.message if response.error else f"it ended {response.status}"
        raise ServerError(f"the conversation could not be compacted: {reason}")
    summary = "".join(
        part.text
        for item in response.output
        if isinstance(item, MessageItem) and item.phase == "final_answer"
        for part in item.content
    ).strip()
    if not summary:
        raise ServerError("the conversation could not be compacted: the model wrote no summary")
    compaction = CompactedResponse(
        id=response.id,
        created_at=response.created_at,
        output=compacted(conversation, summary),
        usage=response.usage,
    )
    return compaction.model_dump(mode="json")


async def warm_up(
    body: ResponsesRequest, app_state: Any, served: Served, *, own: StoredResponse | None = None
) -> StoredResponse:
    """A response that generates nothing (`generate: false`: Codex's warm-up of a new socket):
    completed at once with no output and no tokens, its conversation the request's input, so
    that the next request continues it by its id with only what is new. The input is checked
    as a generating request's is (bad items, tools or format: InvalidRequest); nothing is
    stored, nothing is admitted or evaluated."""
    settings: Settings = app_state.settings
    state: ResponsesState = app_state.responses
    earlier = await _earlier(state, body.previous_response_id, own)
    date = state.conversation_date(body.prompt_cache_key, earlier, settings.today())
    conversation = to_conversation(body, earlier.conversation if earlier is not None else ())
    try:
        transcript = to_transcript(body, conversation, settings.reasoning_effort, date)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    response_id = new_id("resp_")
    echoed = _echoed(body, served.name, transcript, response_id=response_id, summary=None)
    response = ResponseObject(
        **echoed,
        completed_at=echoed["created_at"],
        status="completed",
        usage=ResponseUsage(
            input_tokens=0,
            input_tokens_details=InputTokensDetails(),
            output_tokens=0,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=0,
        ),
        store=False,
    )
    conversation_id = (earlier.conversation_id or earlier.id) if earlier else response_id
    return StoredResponse(
        id=response_id,
        response=response.model_dump(mode="json"),
        conversation=conversation,
        conversation_date=date,
        conversation_id=conversation_id,
    )


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(response_id: str, request: Request) -> Response:
    state: ResponsesState = request.app.state.responses
    stored = await state.store.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(response_id: str, request: Request) -> Response:
    state: ResponsesState = request.app.state.responses
    if not await state.store.delete(response_id):
        raise _not_found(response_id)
    return JSONResponse(DeletedResponse(id=response_id).model_dump(mode="json"))


def _body(events: list[StreamEvent]) -> dict[str, Any]:
    """The non-streaming body: the stream's final response; a failed one raises."""
    response = fold(events)
    if response.status in ("failed", "cancelled"):
        message = response.error.message if response.error else "generation failed"
        raise ServerError(message)
    return response.model_dump(mode="json")


async def _earlier(
    state: ResponsesState, response_id: str | None, own: StoredResponse | None = None
) -> StoredResponse | None:
    if response_id is None:
        return None
    if own is not None and own.id == response_id:
        return own
    stored = await state.store.get(response_id)
    if stored is None:
        raise _not_found(response_id, param="previous_response_id")
    return stored


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", param=param)


def _listed(earlier: StoredResponse | None, body: ResponsesRequest) -> frozenset[str]:
    """The MCP servers whose listing the conversation already shows."""
    output = earlier.response.get("output", []) if earlier is not None else []
    return listed_labels(output if isinstance(output, list) else [], body)


def _check_labels(mcp: McpSetup, builtin: BuiltinSetup) -> None:
    """An MCP server may not take the namespace of a built-in tool the request also offers."""
    clash = sorted(mcp.labels & set(builtin.tools))
    if clash:
        raise InvalidRequest(
            f"the MCP server_label {clash[0]!r} is the namespace of the built-in {clash[0]} tool "
            "this request also enables; give the MCP server another label",
            param="tools",
        )


def _server_tools(
    mcp: McpSetup,
    builtin: BuiltinSetup,
    settings: Settings,
    *,
    decided: Approvals,
    response_id: str,
    conversation_id: str,
    max_calls: int | None,
) -> ServerTools | None:
    """The tools the server runs in this response: the MCP servers' and the built-in ones,
    and the calls the client approved (run first, after admission); at most the request's
    `max_tool_calls` calls, never more than the server allows."""
    if not mcp.tools and not builtin.tools:
        return None
    return ServerTools(
        tools={**mcp.tools, **builtin.tools},
        response_id=response_id,
        conversation_id=conversation_id,
        max_calls=min(settings.tool_max_calls, max_calls or settings.tool_max_calls),
        timeout_s=settings.tool_timeout_s,
        max_output_chars=settings.tool_max_output_chars,
        needs_approval=mcp.needs_approval,
        approved=tuple(decided.approved),
    )


def _call_kind(mcp: McpSetup, builtin: BuiltinSetup) -> Callable[[ToolTarget], ItemKind | None]:
    def kind(target: ToolTarget) -> ItemKind | None:
        return builtin.call_kind(target) or mcp.call_kind(target)

    return kind


def _base_response(
    body: ResponsesRequest,
    transcript: Transcript,
    prepared: Prepared,
    served_name: str,
    *,
    response_id: str,
) -> ResponseObject:
    """The Response as it starts: everything the request asked for, echoed back (the sampling
    parameters as the generation uses them: the server's defaults where the request gave
    none)."""
    return ResponseObject(
        **_echoed(body, served_name, transcript, response_id=response_id, summary=prepared.summary),
        temperature=prepared.params.temperature,
        top_p=prepared.params.top_p,
        store=body.store is not False,
    )


def _echoed(
    body: ResponsesRequest,
    served_name: str,
    transcript: Transcript,
    *,
    response_id: str,
    summary: str | None,
) -> dict[str, Any]:
    """The fields every Response of this request echoes, a generating one or a warm-up."""
    text_format = body.text.format if body.text and body.text.format else {"type": "text"}
    return {
        "id": response_id,
        "created_at": now(),
        "model": body.model or served_name,
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice or "auto",
        "tools": _echoed_tools(body.tools or []),
        "reasoning": {"effort": transcript.reasoning_effort, "summary": summary},
        "text": {"format": text_format},
        "prompt_cache_key": body.prompt_cache_key,
        "top_logprobs": body.top_logprobs or 0,
        "max_tool_calls": body.max_tool_calls,
        "safety_identifier": body.safety_identifier,
        "user": body.user,
    }


def _echoed_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's tools as the response shows (and stores) them: an MCP tool's `headers`
    and `authorization` (credentials) left out; a function tool with every field Open Responses
    requires (`description`, `parameters`, `strict`: null where the request gave none)."""
    secret = ("headers", "authorization")
    echoed = []
    for tool in tools:
        if tool.get("type") == "mcp":
            echoed.append({k: v for k, v in tool.items() if k not in secret})
        elif tool.get("type") == "function":
            echoed.append({"description": None, "parameters": None, "strict": None, **tool})
        else:
            echoed.append(tool)
    return echoed


@dataclass
class _Finisher:
    """Runs when a response is final, before its terminal event leaves: log, then store."""

    state: ResponsesState
    generator: Generator
    conversation: tuple[Item, ...]  # what the request asked about, stored with the output
    date: str
    store: bool
    conversation_id: str | None = None
    remember: Callable[[StoredResponse], None] | None = None  # handed the record, stored or not

    async def __call__(self, last: list[StreamEvent], ended: list[Ended]) -> None:
        response = fold(last)  # the response the terminal event carries
        usage = response.usage
        if usage is not None:
            log.info(
                "response %s %s: %d input tokens (%d cached), %d output tokens (%d reasoning)",
                response.id,
                response.status,
                usage.input_tokens,
                usage.input_tokens_details.cached_tokens,
                usage.output_tokens,
                usage.output_tokens_details.reasoning_tokens,
            )
        if usage is not None and usage.summary_usage is not None:
            spent = usage.summary_usage
            log.info(
                "response %s: %d reasoning summaries, %d input tokens, %d output tokens",
                response.id,
                spent.summaries,
                spent.input_tokens,
                spent.output_tokens,
            )
        if not self.store and self.remember is None:
            return
        message_start = list(self.generator.renderer.assistant_start)
        outputs = output_items(ended, message_start)
        record = StoredResponse(
            id=response.id,
            response=response.model_dump(mode="json"),
            conversation=(*self.conversation, *outputs),
            conversation_date=self.date,
            conversation_id=self.conversation_id,
        )
        if self.remember is not None:
            self.remember(record)
        if self.store:
            await self.state.store.put(record)
