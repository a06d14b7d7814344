"""Server-run tools inside one generation: run the call, append its result, sample on.

A generation whose last message is a call to a tool the server runs itself (an MCP server's,
`server.tools`) does not end there: the core runs the tool, renders its result as the harmony
tool message and appends that to the prompt the engine already holds (the prompt, every token
sampled so far, the result, `<|start|>assistant`), so the next round evaluates only the result's
tokens: the engine's slot keeps the rest. The client sees one response: the rounds' segments
numbered on, a `ToolOutput` event after each server-run call, one `Finished` with the rounds'
usage summed.

Calls the client approved (an MCP server's calls that wait for the user: `ServerTools.approved`)
end the conversation the request sends; they run here too, after admission, as the response's
first tool round: their results are appended to the prompt before the first generation.

Limits: `max_calls` server-run calls per response, approved ones included (more approved calls
than that are refused with the request; after the last one the model may not call a tool
again: the next round is steered to answer), `timeout_s` per call (then the call ends with an
error result), `max_output_chars` of result text (cut with a note to the model). A tool that
raises or hangs ends its call with an error result, never the response.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from server.contracts import events as ev
from server.contracts.errors import InvalidRequest, RequestField
from server.contracts.transcript import ToolCall, Transcript
from server.tools.base import ServerTool, ToolContext, ToolResult, truncate

log = logging.getLogger(__name__)

DEFAULT_MAX_CALLS = 16
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT_CHARS = 20_000


@dataclass(frozen=True)
class ServerTools:
    """The server-run tools one response may use, by the namespace the client named them in
    (an MCP server's label), and the limits on them.

    `runs(target)` says whether a call is run here (a tool whose call needs the user's approval
    first is not: that call goes back to the client as any other). `approved`: the ids of the
    calls the user approved, which end the conversation; they run first.
    """

    tools: Mapping[str, ServerTool]
    response_id: str
    conversation_id: str | None = None
    max_calls: int = DEFAULT_MAX_CALLS
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    needs_approval: Callable[[ev.ToolTarget], bool] = field(default=lambda _target: False)
    approved: tuple[str, ...] = ()

    def runs(self, target: ev.ToolTarget | None) -> bool:
        return (
            target is not None
            and target.namespace in self.tools
            and not self.needs_approval(target)
        )

    async def run(self, target: ev.ToolTarget, arguments: str) -> ToolResult:
        """The call's result: the tool's own, or an error result (failure, timeout); cut to
        `max_output_chars`."""
        tool = self.tools[target.namespace]
        ctx = ToolContext(
            response_id=self.response_id,
            conversation_id=self.conversation_id,
            timeout_s=self.timeout_s,
            max_output_chars=self.max_output_chars,
        )
        try:
            result = await asyncio.wait_for(tool.call(target.name, arguments, ctx), self.timeout_s)
        except TimeoutError:
            message = f"the tool {target.name} did not answer within {self.timeout_s:g} s"
            log.warning("server tool %s.%s timed out", target.namespace, target.name)
            result = ToolResult(message, is_error=True)
        except Exception as exc:  # a backend that broke its promise not to raise
            log.exception("server tool %s.%s raised", target.namespace, target.name)
            message = f"the tool {target.name} failed: {type(exc).__name__}"
            result = ToolResult(message, is_error=True)
        text, cut = truncate(result.text, self.max_output_chars)
        return dataclasses.replace(result, text=text) if cut else result

    def result_channel(self, call: ev.SegmentEnd) -> str:
        """The channel of the call's result message: a built-in tool (python, browser) answers
        on its call's channel, as gpt-oss's reference tools do (python is called from the
        analysis channel); every other tool on commentary."""
        target = call.target
        tool = self.tools.get(target.namespace) if target is not None else None
        if tool is not None and tool.description().builtin is not None and call.channel:
            return call.channel
        return "commentary"

    def refused(self, call: ev.SegmentEnd, index: int) -> ev.ToolOutput:
        """The output of a call past `max_calls`: not run; the response ends with it."""
        message = (
            f"not run: the limit of {self.max_calls} server-run tool calls per response was reached"
        )
        return ev.ToolOutput(
            index=index,
            call_id=call.call_id or "",
            target=call.target or ev.ToolTarget(""),
            arguments=call.text,
            text=message,
            is_error=True,
        )


@dataclass(frozen=True)
class ServerCall:
    """A call to run here: the tool as the client named it, and the call's harmony recipient
    (its result's author)."""

    call_id: str
    target: ev.ToolTarget
    arguments: str
    recipient: str


def approved_calls(
    transcript: Transcript, seen: Transcript, tools: ServerTools
) -> tuple[ServerCall, ...]:
    """The calls `tools.approved` names: the last items of the conversation (`transcript`, as
    the client named its tools; `seen`, as the model sees it). Raises InvalidRequest for more
    of them than `max_calls`, or for an approved call that does not end the conversation."""
    approved = tools.approved
    if not approved:
        return ()
    if len(approved) > tools.max_calls:
        raise InvalidRequest(
            f"{len(approved)} tool calls are approved; at most {tools.max_calls} server-run tool "
            "calls run per response (the server's --tool-max-calls): approve fewer at once",
            field=RequestField.CONVERSATION,
        )
    calls = [item for item in transcript.items[-len(approved) :] if isinstance(item, ToolCall)]
    if sorted(call.call_id for call in calls) != sorted(approved):
        raise InvalidRequest(
            "an approved tool call runs before the next generation, so its approval request "
            "must end the conversation: answer it in the request that follows it, with no "
            "other item after the request",
            field=RequestField.CONVERSATION,
        )
    recipients = {item.call_id: item.recipient for item in seen.items if isinstance(item, ToolCall)}
    return tuple(
        ServerCall(
            call.call_id,
            ev.ToolTarget(call.name, call.namespace),
            call.arguments,
            recipients[call.call_id],
        )
        for call in calls
    )


def server_call(ended: list[ev.SegmentEnd], tools: ServerTools) -> ev.SegmentEnd | None:
    """The round's last message when it is a complete call to a server-run tool."""
    if not ended:
        return None
    last = ended[-1]
    if last.kind is not ev.SegmentKind.TOOL_CALL or not last.complete or not last.recipient:
        return None
    return last if tools.runs(last.target) else None


def shifted(event: ev.GenerationEvent, offset: int) -> ev.GenerationEvent:
    """An event of a later round with its segment numbered after the earlier rounds'."""
    if offset == 0:
        return event
    if isinstance(event, ev.SegmentStart | ev.SegmentDelta | ev.SegmentEnd):
        return dataclasses.replace(event, index=event.index + offset)
    if isinstance(event, ev.SummaryStart | ev.SummaryDelta | ev.SummaryEnd):
        return dataclasses.replace(event, segment=event.segment + offset)
    return event


def merged(first: ev.Finished, later: ev.Finished) -> ev.Finished:
    """The `Finished` of a response of several rounds: the later round's reason, the sums."""
    usage = ev.summed_usage((first.usage, later.usage))
    s, t = first.timings, later.timings
    timings = ev.Timings(
        queue_s=s.queue_s + t.queue_s,
        prefill_s=s.prefill_s + t.prefill_s,
        decode_s=s.decode_s + t.decode_s,
        ttft_s=s.ttft_s,
        evaluated_tokens=s.evaluated_tokens + t.evaluated_tokens,
        completion_tokens=s.completion_tokens + t.completion_tokens,
        draft_n=s.draft_n + t.draft_n,
        draft_n_accepted=s.draft_n_accepted + t.draft_n_accepted,
    )
    return dataclasses.replace(
        later,
        usage=usage,
        timings=timings,
        malformed=first.malformed or later.malformed,
    )
