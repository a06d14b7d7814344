"""Generation events: the API-neutral stream that every emitter folds into an HTTP response.

The harmony decoder turns sampled token ids into segment events (one segment per harmony
message); the generation core appends one `Finished` event. When summaries are asked for, the
core also emits the summary events of each reasoning segment (see server.core.summaries). Streaming
emitters translate each event as it comes; non-streaming responses are a fold of the same events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from server.contracts.directives import SteeringStats
from server.contracts.transcript import FUNCTIONS_NAMESPACE, ToolKind


class SegmentKind(StrEnum):
    """What a harmony assistant message is, seen from the API side."""

    REASONING = "reasoning"  # channel analysis: raw chain of thought
    PREAMBLE = "preamble"  # channel commentary without recipient: user-visible progress text
    TOOL_CALL = "tool_call"  # a message with a recipient (functions.X, namespace.X)
    FINAL = "final"  # channel final (or no channel): the answer


@dataclass(frozen=True, slots=True)
class ToolTarget:
    """The tool a call is addressed to, in the names the client gave it (set by the core).

    Adapters read it as it is; nothing outside the core parses a harmony recipient string.
    """

    name: str
    namespace: str = FUNCTIONS_NAMESPACE
    kind: ToolKind = "function"

    @property
    def in_default_namespace(self) -> bool:
        return self.namespace == FUNCTIONS_NAMESPACE

    @property
    def qualified_name(self) -> str:
        """`name` for a function in the default namespace, else `namespace.name`."""
        return self.name if self.in_default_namespace else f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class SegmentStart:
    """A harmony message's header is complete; its content follows."""

    index: int
    kind: SegmentKind
    channel: str | None
    recipient: str | None = None
    content_type: str | None = None
    call_id: str | None = None  # tool calls only: a fresh id clients send back with the result
    target: ToolTarget | None = None  # tool calls only: the tool, in the client's names


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The log-probability of one token the model produced, and the most likely alternatives.

    From the model's own distribution at that position (log-softmax of the logits: before
    temperature, top-p/k, steering and grammars; see docs/sampling.md#log-probabilities).
    `top` is sorted from the most likely token down.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class SegmentDelta:
    """Decoded content text of the open segment (complete UTF-8 characters only).

    `logprobs`: the content tokens this text came from, when the request asked for them (a
    token that completes no character is reported with the next delta of its segment).
    """

    index: int
    kind: SegmentKind
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """A segment ended: by its terminator token, or cut short (`complete=False`)."""

    index: int
    kind: SegmentKind
    text: str
    tokens: tuple[int, ...]  # exactly the sampled tokens of this message, terminator included
    complete: bool = True
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    call_id: str | None = None
    target: ToolTarget | None = None  # tool calls only: the tool, in the client's names


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A server-run tool's result, appended to the generation right after its call.

    Follows the call's `SegmentEnd` (segment `index`); generation then goes on in the same
    response. `text` is what the model read (truncated where the result was too long);
    `details` are the fields the tool's backend adds to the API's output item (an MCP call's
    `output` or `error`); `tokens` are the harmony tool message appended to the prompt.
    """

    index: int
    call_id: str
    target: ToolTarget
    arguments: str
    text: str
    is_error: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    tokens: tuple[int, ...] = ()
    channel: str = "commentary"  # the channel of the result message (a built-in's: its call's)


@dataclass(frozen=True, slots=True)
class DecodeWarning:
    """The model left the harmony grammar; what could not be parsed is reported, not raised."""

    message: str
    text: str = ""
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SummaryStart:
    """A summary of reasoning segment `segment` follows (always after that segment's end)."""

    segment: int


@dataclass(frozen=True, slots=True)
class SummaryDelta:
    """Summary text of reasoning segment `segment` (complete UTF-8 characters only)."""

    segment: int
    text: str


class FinishReason(StrEnum):
    """Why generation ended."""

    STOP = "stop"  # <|return|>: the answer is complete
    TOOL_CALL = "tool_call"  # <|call|>: the model waits for a tool result
    LENGTH = "length"  # max tokens or the context window reached
    CANCELLED = "cancelled"  # the client went away or the request was cancelled
    ERROR = "error"  # the engine failed


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one generation."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV state was reused
    evaluated_tokens: int = 0  # prompt tokens actually evaluated by the model
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # completion tokens inside analysis messages

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def summed_usage(usages: Iterable[Usage]) -> Usage:
    """Every count of `usages` added up (a response's rounds, a request's summaries)."""
    parts = tuple(usages)
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in parts),
        cached_tokens=sum(u.cached_tokens for u in parts),
        evaluated_tokens=sum(u.evaluated_tokens for u in parts),
        completion_tokens=sum(u.completion_tokens for u in parts),
        reasoning_tokens=sum(u.reasoning_tokens for u in parts),
    )


@dataclass(frozen=True, slots=True)
class Timings:
    """Wall-clock timings of one generation, in seconds."""

    queue_s: float = 0.0  # waiting for the engine
    prefill_s: float = 0.0  # evaluating the prompt
    decode_s: float = 0.0  # from the first to the last sampled token
    ttft_s: float = 0.0  # from submission to the first sampled token
    evaluated_tokens: int = 0
    completion_tokens: int = 0
    draft_n: int = 0  # drafted tokens verified (speculative decoding; llama-server's name)
    draft_n_accepted: int = 0  # of them accepted

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.evaluated_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        steps = self.completion_tokens - 1  # the first token comes from the prefill
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class SummaryEnd:
    """The summary of reasoning segment `segment` is done; `complete=False` if cut short.

    `usage` and `timings` are those of the summary's own generation.
    """

    segment: int
    text: str
    complete: bool = True
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True, slots=True)
class SummaryReport:
    """What the summaries of one generation cost, reported apart from the generation itself.

    `usage` and `timings` are summed over the summaries (they may have run side by side);
    `wait_s` is how long the end of the response waited for them after the main generation
    had finished: the latency they added.
    """

    count: int = 0
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every generation, also on cancellation and errors."""

    reason: FinishReason
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    error: str | None = None
    unavailable: bool = False  # an ERROR because the model cannot generate now (HTTP 503)
    summaries: SummaryReport | None = None  # set when summaries were asked for
    malformed: bool = False  # the output left the harmony grammar; the events hold what parsed
    stop_sequence: str | None = None  # the request's stop string that ended the answer, if any
    steering: SteeringStats = field(default_factory=SteeringStats)  # overrides of the model


DecoderEvent = SegmentStart | SegmentDelta | SegmentEnd | DecodeWarning
SummaryEvent = SummaryStart | SummaryDelta | SummaryEnd
GenerationEvent = (
    SegmentStart
    | SegmentDelta
    | SegmentEnd
    | DecodeWarning
    | SummaryStart
    | SummaryDelta
    | SummaryEnd
    | ToolOutput
    | Finished
)
