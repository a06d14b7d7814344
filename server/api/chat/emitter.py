"""Generation events -> Chat Completions chunks (ChatEmitter), and the folded non-streaming body.

Streaming sends each delta in a chunk as it comes; the non-streaming body merges the deltas of the
very same chunks, so both answers always agree. What each kind of segment sends is a table
(`_LIFECYCLES`: on its start, with each text delta; nothing on its end). Reasoning summaries are
`reasoning_details` entries of type `reasoning.summary`, one per reasoning segment (index 0 is the
raw `reasoning.text` entry when that is shown); where the raw reasoning is not shown, the
summaries also stand in for it as `reasoning`, the field chat UIs display.

The stream ends with a chunk carrying the finish reason (then the usage chunk, if asked for) and
`[DONE]`; a failed generation ends with OpenAI's error envelope and `[DONE]`; a cancelled one (the
client went away) with nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from server.api.chat.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChoiceOut,
    Delta,
    MessageOut,
    ReasoningDetailOut,
    SummaryUsageOut,
    ToolCallDelta,
    ToolCallOut,
    UsageOut,
)
from server.api.logprobs import TokenLogprobOut, token_entries
from server.api.response_fields import summary_timings_out, timings_out
from server.api.sse import DONE, sse_data
from server.contracts.errors import ServerError, error_envelope
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentKind,
    SegmentStart,
    SummaryDelta,
    SummaryReport,
    SummaryStart,
    Usage,
)
from server.harmony.token_bytes import TokenBytes

FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.TOOL_CALL: "tool_calls",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "stop",
    FinishReason.ERROR: "stop",
}


@dataclass(frozen=True)
class ChatFailed:
    """The end of a failed stream: OpenAI's error envelope as a `data:` line."""

    message: str

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.message, "server_error")


ChatEvent = ChatCompletionChunk | ChatFailed | Literal["[DONE]"]
"""One `data:` line of a chat stream."""


def encode(event: ChatEvent) -> bytes:
    """The SSE bytes of one chat stream event."""
    if isinstance(event, str):
        return DONE
    if isinstance(event, ChatFailed):
        return sse_data(event.envelope())
    return sse_data(event)


@dataclass
class ChatEmitter:
    """Turns generation events into chat chunks; remembers how the generation finished.

    Several analysis messages become one reasoning text, separated by a newline (their
    summaries too). Tool calls are numbered in the order the model makes them.
    """

    factory: ChunkFactory
    include_reasoning: bool  # the raw reasoning
    reasoning_content: bool = True  # also send the reasoning as `reasoning_content`
    summaries: bool = False  # the reasoning summaries
    include_usage: bool = False  # a usage chunk after the finish reason
    logprobs: TokenBytes | None = None  # the content tokens' logprobs were asked for
    reasoning_logprobs: bool = False  # and the reasoning tokens' (`logprobs.reasoning`)
    finished: Finished | None = None
    _has_reasoning: bool = False
    _needs_separator: bool = False
    _tool_calls: int = 0
    _summary_index: dict[int, int] = field(default_factory=dict)  # segment -> details index
    _summary_text_of: int | None = None  # the segment whose summary text was sent last

    @property
    def waits_for_summaries(self) -> bool:
        return False  # summaries are `reasoning_details` entries by index: no item order to keep

    @property
    def done(self) -> bool:
        return self.finished is not None

    def start(self) -> list[ChatEvent]:
        return [self.factory.chunk(Delta(role="assistant", content=""))]

    def keepalive(self) -> list[ChatEvent]:
        return []  # Chat Completions has no keepalive event

    def feed(self, event: GenerationEvent) -> list[ChatEvent]:
        if self.finished is not None:
            return []
        if isinstance(event, Finished):
            return self._finish(event)
        chunks = [self.factory.chunk(delta) for delta in self._deltas(event)]
        if chunks and isinstance(event, SegmentDelta) and event.logprobs:
            scored = self._scored(event)
            if scored is not None:
                chunks[0]["choices"][0]["logprobs"] = scored
        return list[ChatEvent](chunks)

    def _scored(self, delta: SegmentDelta) -> ChoiceLogprobs | None:
        """The logprobs a chunk carries with this delta's text (content, or reasoning when asked
        for); none for tool-call arguments."""
        if self.logprobs is None:
            return None
        if delta.kind in (SegmentKind.FINAL, SegmentKind.PREAMBLE):
            return ChoiceLogprobs(
                content=token_entries(delta.logprobs, self.logprobs), refusal=None
            )
        if delta.kind is SegmentKind.REASONING and self.reasoning_logprobs:
            entries = token_entries(delta.logprobs, self.logprobs)
            return ChoiceLogprobs(content=[], refusal=None, reasoning=entries)
        return None

    def _deltas(self, event: GenerationEvent) -> list[Delta]:
        if isinstance(event, SegmentStart):
            return _LIFECYCLES[event.kind].start(self, event)
        if isinstance(event, SegmentDelta):
            return _LIFECYCLES[event.kind].delta(self, event.text)
        if isinstance(event, SummaryStart):
            first = 1 if self.include_reasoning else 0
            self._summary_index[event.segment] = first + len(self._summary_index)
        elif isinstance(event, SummaryDelta):
            return self._summary(event)
        return []  # segment ends, summary ends, decode warnings: nothing to send

    # -------------------------------------------------------------------------- segments

    def _reasoning_start(self, _: SegmentStart) -> list[Delta]:
        self._needs_separator = self._has_reasoning
        return []

    def _reasoning(self, text: str) -> list[Delta]:
        if not self.include_reasoning:
            return []
        text = "\n" + text if self._needs_separator else text
        self._has_reasoning, self._needs_separator = True, False
        delta = Delta(reasoning=text)
        if self.reasoning_content:
            delta["reasoning_content"] = text
        return [delta]

    def _call_start(self, start: SegmentStart) -> list[Delta]:
        call = ToolCallDelta(
            index=self._tool_calls,
            id=start.call_id or "",
            type="function",
            function={"name": _function_name(start), "arguments": ""},
        )
        self._tool_calls += 1
        return [Delta(tool_calls=[call])]

    def _arguments(self, text: str) -> list[Delta]:
        fragment = ToolCallDelta(index=self._tool_calls - 1, function={"arguments": text})
        return [Delta(tool_calls=[fragment])]

    def _text_start(self, _: SegmentStart) -> list[Delta]:
        return []

    def _content(self, text: str) -> list[Delta]:
        return [Delta(content=text)]

    # -------------------------------------------------------------------------- summaries

    def _summary(self, event: SummaryDelta) -> list[Delta]:
        if not self.summaries or not event.text:
            return []
        index = self._summary_index.get(event.segment, 0)
        detail = ReasoningDetailOut(
            type="reasoning.summary", summary=event.text, format="unknown", index=index
        )
        delta = Delta(reasoning_details=[detail])
        if not self.include_reasoning:  # the summary stands in for the reasoning
            after = self._summary_text_of
            text = "\n" + event.text if after not in (None, event.segment) else event.text
            self._summary_text_of = event.segment
            delta["reasoning"] = text
            if self.reasoning_content:
                delta["reasoning_content"] = text
        return [delta]

    # -------------------------------------------------------------------------- the end

    def _finish(self, finished: Finished) -> list[ChatEvent]:
        self.finished = finished
        if finished.reason is FinishReason.CANCELLED:
            return []  # the client went away: nobody reads an ending
        if finished.reason is FinishReason.ERROR:
            return [ChatFailed(f"generation failed: {finished.error}"), "[DONE]"]
        out: list[ChatEvent] = [self.factory.chunk(Delta(), self.finish_reason)]
        if self.include_usage:
            out.append(self.factory.usage_chunk(finished))
        out.append("[DONE]")
        return out

    def usage(self) -> UsageOut:
        """This choice's usage (once finished)."""
        finished = self.finished or Finished(FinishReason.ERROR)
        return usage_out(finished.usage, finished.summaries)

    @property
    def finish_reason(self) -> str:
        reason = self.finished.reason if self.finished else FinishReason.ERROR
        return FINISH_REASONS[reason]


@dataclass(frozen=True)
class _Lifecycle:
    """What a segment of one kind sends: on its start, and with each text delta."""

    start: Callable[[ChatEmitter, SegmentStart], list[Delta]]
    delta: Callable[[ChatEmitter, str], list[Delta]]


_LIFECYCLES = {
    SegmentKind.REASONING: _Lifecycle(ChatEmitter._reasoning_start, ChatEmitter._reasoning),
    SegmentKind.PREAMBLE: _Lifecycle(ChatEmitter._text_start, ChatEmitter._content),
    SegmentKind.FINAL: _Lifecycle(ChatEmitter._text_start, ChatEmitter._content),
    SegmentKind.TOOL_CALL: _Lifecycle(ChatEmitter._call_start, ChatEmitter._arguments),
}


def usage_out(usage: Usage, summaries: SummaryReport | None = None) -> UsageOut:
    out = UsageOut(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details={"cached_tokens": usage.cached_tokens},
        completion_tokens_details={"reasoning_tokens": usage.reasoning_tokens},
    )
    if summaries is not None:
        spent = summaries.usage
        out["summary_usage"] = SummaryUsageOut(
            summaries=summaries.count,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            total_tokens=spent.total_tokens,
            prompt_tokens_details={"cached_tokens": spent.cached_tokens},
            completion_tokens_details={"reasoning_tokens": spent.reasoning_tokens},
        )
    return out


def chat_timings(finished: Finished) -> dict[str, float]:
    timings = timings_out(finished.timings, finished.usage)
    if finished.summaries is not None:
        timings.update(summary_timings_out(finished.summaries))
    return timings


@dataclass(frozen=True)
class ChunkFactory:
    """Builds chunks that share one id, timestamp and model name."""

    id: str
    created: int
    model: str
    index: int = 0  # the choice (`n` > 1)

    def chunk(self, delta: Delta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=[
                {
                    "index": self.index,
                    "delta": delta,
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
        )

    def completion(self, choice: ChoiceOut) -> ChatCompletion:
        """The non-streaming body around its one choice, with the chunks' id, time and model."""
        return ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=[choice],
        )

    def usage_chunk(self, finished: Finished) -> ChatCompletionChunk:
        chunk = ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=[],
            usage=usage_out(finished.usage, finished.summaries),
        )
        chunk["timings"] = chat_timings(finished)
        return chunk


def fold(events: Sequence[ChatEvent], emitter: ChatEmitter) -> ChatCompletion:
    """The non-streaming body: the deltas of the very same chunks, merged.

    A failed generation raises ServerError with the message its stream would end with.
    """
    deltas: list[Delta] = []
    for event in events:
        if isinstance(event, ChatFailed):
            raise ServerError(event.message)
        if not isinstance(event, str):
            deltas += [choice["delta"] for choice in event.get("choices", [])]
    factory = emitter.factory
    text = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning", "") for d in deltas)
    message = MessageOut(role="assistant", content=text or None)
    if reasoning:
        message["reasoning"] = reasoning
        if emitter.reasoning_content:
            message["reasoning_content"] = reasoning
    details = _merged_details(deltas)
    if reasoning and emitter.include_reasoning:
        raw = ReasoningDetailOut(type="reasoning.text", text=reasoning, format="unknown", index=0)
        details.insert(0, raw)
    if details:
        message["reasoning_details"] = details
    calls = _merged_tool_calls(deltas)
    if calls:
        message["tool_calls"] = calls
    body = factory.completion(
        ChoiceOut(
            index=factory.index,
            message=message,
            finish_reason=emitter.finish_reason,
            logprobs=_merged_logprobs(events, emitter),
        )
    )
    finished = emitter.finished
    if finished is not None:
        body["usage"] = usage_out(finished.usage, finished.summaries)
        body["timings"] = chat_timings(finished)
    return body


def _merged_logprobs(events: Sequence[ChatEvent], emitter: ChatEmitter) -> ChoiceLogprobs | None:
    """The chunks' logprobs, joined (None when the request did not ask for them)."""
    if emitter.logprobs is None:
        return None
    content: list[TokenLogprobOut] = []
    reasoning: list[TokenLogprobOut] = []
    for event in events:
        for choice in event.get("choices", []) if isinstance(event, dict) else []:
            scored = choice["logprobs"]
            if scored is not None:
                content += scored["content"] or []
                reasoning += scored.get("reasoning", [])
    merged = ChoiceLogprobs(content=content, refusal=None)
    if emitter.reasoning_logprobs:
        merged["reasoning"] = reasoning
    return merged


def _merged_details(deltas: list[Delta]) -> list[ReasoningDetailOut]:
    """The summary entries of `reasoning_details`, their fragments joined, by index."""
    merged: dict[int, ReasoningDetailOut] = {}
    for delta in deltas:
        for fragment in delta.get("reasoning_details", []):
            index = fragment.get("index", 0)
            entry = merged.setdefault(
                index,
                ReasoningDetailOut(
                    type="reasoning.summary", summary="", format="unknown", index=index
                ),
            )
            entry["summary"] += fragment.get("summary", "")
    return [merged[index] for index in sorted(merged)]


def _merged_tool_calls(deltas: list[Delta]) -> list[ToolCallOut]:
    calls: list[ToolCallOut] = []
    for delta in deltas:
        for fragment in delta.get("tool_calls", []):
            function = fragment.get("function", {})
            if "id" in fragment:
                name = function.get("name", "")
                calls.append(
                    ToolCallOut(id=fragment["id"], type="function", function={"name": name})
                )
                calls[-1]["function"]["arguments"] = ""
            calls[fragment["index"]]["function"]["arguments"] += function.get("arguments", "")
    return calls


def _function_name(event: SegmentStart) -> str:
    """The called function's name (`namespace.name` outside the default namespace)."""
    return event.target.qualified_name if event.target is not None else ""
