"""Prepared: one admitted generation, run as events.

`Prepared.events()` streams decoder events while the engine samples and ends with exactly one
`Finished` event, also on cancellation and engine errors. When summaries are asked for, the
events of a short summary generation per reasoning segment are merged in (server.core.summaries).
Each round runs on the engine loop every generation shares (server.core.rounds); what harmony
makes of its chunks is `_HarmonyReader`'s. What it needs of the server (the rounds, harmony's
parts, the history, the summaries) the Generator hands it as a `ChatContext`; `FirstRound` holds
its first round where a streamed response submits it ahead of its events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial

from openai_harmony import HarmonyEncoding

from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentEnd,
    SegmentStart,
    ToolOutput,
)
from server.core.admission import Ticket
from server.core.client_events import ClientEvents
from server.core.finish import finished_event
from server.core.history import History
from server.core.rounds import Rounds
from server.core.save_points import SavePoints
from server.core.stop_strings import StopStrings
from server.core.summaries import SummaryMerge
from server.core.tool_loop import ServerCall, ServerTools, merged, server_call, shifted
from server.core.tool_names import ToolNames
from server.core.visibility import SummaryStyle
from server.engine.base import EngineResult, SamplingParams, SlotPin, TokenChunk, TokenStream
from server.harmony.decoder import HarmonyDecoder, ParserStock
from server.harmony.renderer import Renderer
from server.harmony.steering import HarmonySteering, SteeringPlan

log = logging.getLogger(__name__)

BEGIN_WAIT_S = 0.02  # `FirstRound.begin` waits this long at most for the engine to take it


@dataclass(frozen=True)
class ChatContext:
    """What chat-style generations need of the server, handed to each by the Generator."""

    rounds: Rounds  # the engine loop every generation shares
    encoding: HarmonyEncoding
    parsers: ParserStock  # harmony's streaming parsers, made before the rounds that use them
    renderer: Renderer
    history: History
    save_points: SavePoints
    summarize: Callable[[str, SummaryStyle], Prepared | None]  # a reasoning's summary run


@dataclass(frozen=True)
class Prepared:
    """A validated generation, ready to run."""

    context: ChatContext
    prompt_tokens: list[int]
    params: SamplingParams
    steering: SteeringPlan
    stop: tuple[str, ...] = ()
    names: ToolNames | None = None
    summary: SummaryStyle | None = None  # summarize each reasoning segment in this style
    ticket: Ticket | None = None  # the request's place in admission; None for summaries
    record: bool = True  # remember the generated messages in the history
    save_points: tuple[int, ...] = ()  # prompt lengths the engine may save to disk
    tools: ServerTools | None = None  # tools the server runs itself (server.core.tool_loop)
    # the steering of the rounds after a server-run call: calls allowed, and none (limit reached)
    later_steering: tuple[SteeringPlan, SteeringPlan] | None = None
    # calls the user approved, at the prompt's end: run before the first round (tool_loop)
    approved: tuple[ServerCall, ...] = ()
    pin: SlotPin | None = None  # the conversation's claim on its slot: every round of it runs there
    # the first round, where a streamed response submits it before reading the events
    first: FirstRound = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # what the first round needs, not the Prepared itself: dropped unread, a Prepared is
        # freed at once (its admission place given back: Generator.admit), no cycle to wait for
        context = self.context
        start = None  # a generation that first runs approved calls begins nothing
        if not self.approved:
            prompt, points = self.prompt_tokens, self.save_points
            start = partial(
                _submit, context, prompt, self.params, self.steering, points, pin=self.pin
            )
        reader = partial(
            _HarmonyReader, context, stops=self.stop, names=self.names, record=self.record
        )
        object.__setattr__(self, "first", FirstRound(start, reader, context.rounds, self.ticket))

    def events(self) -> AsyncIterator[GenerationEvent]:
        """Decoder events while the engine samples (summary events merged in), then Finished.

        Complete messages are recorded in the history, so the next request can replay them.
        If the consumer leaves early, the engine requests are cancelled and still reported to
        `on_finished` once the engine lets go of them.
        """
        if self.summary is None:
            events = self._events()
        else:
            history = self.context.history
            merge = SummaryMerge(self._events(), self._summary_events, history.record_summaries)
            events = merge.events()
        return events if self.ticket is None else _releasing(events, self.ticket)

    async def _summary_events(self, reasoning: str) -> AsyncIterator[GenerationEvent]:
        assert self.summary is not None
        prepared = self.context.summarize(reasoning, self.summary)
        if prepared is None:
            yield Finished(FinishReason.LENGTH)
            return
        async for event in prepared.events():
            yield event

    async def _events(self) -> AsyncGenerator[GenerationEvent, None]:
        tools, later = self.tools, self.later_steering
        if tools is None or later is None:
            rounds = self._round(self.prompt_tokens, self.params, self.steering, self.save_points)
        elif self.approved:
            rounds = self._approved_round(tools, later)
        else:
            first = _Start(self.prompt_tokens, self.params, self.steering, self.save_points)
            rounds = self._tool_rounds(tools, later, first)
        async with aclosing(rounds) as events:
            async for event in events:
                yield event

    async def _approved_round(
        self, tools: ServerTools, later: tuple[SteeringPlan, SteeringPlan]
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The calls the user approved run first (they end the prompt, before its
        `<|start|>assistant`); their results appended, the rounds of generation follow."""
        context = self.context
        start = list(context.renderer.assistant_start)
        prompt = self.prompt_tokens[: len(self.prompt_tokens) - len(start)]
        for approved in self.approved:
            output = await self._run(tools, approved, -1, "commentary")
            yield output
            prompt = [*prompt, *output.tokens]
        prompt = [*prompt, *start]
        calls = len(self.approved)
        room = context.rounds.engine.info.n_ctx - len(prompt)
        if room <= 0:
            yield Finished(FinishReason.LENGTH)
            return
        first = _Start(
            prompt,
            dataclasses.replace(self.params, max_tokens=min(self.params.max_tokens, room)),
            later[1] if calls >= tools.max_calls else self.steering,
            context.save_points(prompt),
            calls,
        )
        async with aclosing(self._tool_rounds(tools, later, first)) as events:
            async for event in events:
                yield event

    async def _tool_rounds(
        self, tools: ServerTools, later: tuple[SteeringPlan, SteeringPlan], first: _Start
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Rounds of generation while the model calls server-run tools (see tool_loop)."""
        context = self.context
        prompt, params, plan, points = first.prompt, first.params, first.plan, first.points
        offset, calls = 0, first.calls
        total: Finished | None = None
        while True:
            sampled: list[int] = []
            ended: list[SegmentEnd] = []
            n_segments = 0
            finished: Finished | None = None
            async with aclosing(self._round(prompt, params, plan, points, sampled)) as events:
                async for event in events:
                    if isinstance(event, Finished):
                        finished = event
                        continue
                    if isinstance(event, SegmentStart):
                        n_segments = event.index + 1
                    elif isinstance(event, SegmentEnd):
                        ended.append(event)
                    yield shifted(event, offset)
            assert finished is not None
            total = finished if total is None else merged(total, finished)
            call = server_call(ended, tools) if finished.reason is FinishReason.TOOL_CALL else None
            if call is None or call.target is None or call.recipient is None:
                yield total
                return
            if calls >= tools.max_calls:  # the model called despite the steering: not run
                yield tools.refused(call, call.index + offset)
                yield total
                return
            calls += 1
            ran = ServerCall(call.call_id or "", call.target, call.text, call.recipient)
            output = await self._run(tools, ran, call.index + offset, tools.result_channel(call))
            yield output
            offset += n_segments
            prompt = [*prompt, *sampled, *output.tokens, *context.renderer.assistant_start]
            room = context.rounds.engine.info.n_ctx - len(prompt)
            left = params.max_tokens - finished.usage.completion_tokens
            if room <= 0 or left <= 0:
                yield dataclasses.replace(total, reason=FinishReason.LENGTH)
                return
            params = dataclasses.replace(params, max_tokens=min(left, room))
            plan = later[1] if calls >= tools.max_calls else later[0]
            points = ()

    async def _run(
        self, tools: ServerTools, call: ServerCall, index: int, channel: str
    ) -> ToolOutput:
        """A server-run call run: its output, with the harmony tool message of its result. The
        response's admission place is given to others while the tool runs (admission.py)."""
        stepped_out = self.ticket is not None and self.ticket.step_out()
        result = await tools.run(call.target, call.arguments)
        if stepped_out and self.ticket is not None:
            await self.ticket.step_in()
        tokens = self.context.renderer.tool_result_tokens(call.recipient, result.text, channel)
        return ToolOutput(
            index=index,
            call_id=call.call_id,
            target=call.target,
            arguments=call.arguments,
            text=result.text,
            is_error=result.is_error,
            details=dict(result.item),
            tokens=tuple(tokens),
            channel=channel,
        )

    def _round(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        plan: SteeringPlan,
        save_points: tuple[int, ...],
        sampled: list[int] | None = None,
    ) -> AsyncGenerator[GenerationEvent, None]:
        """One engine generation: its events, then its Finished. `sampled` gets every token
        the engine sampled (a server-run tool's round appends to them). The first round takes
        over the one `FirstRound.begin` submitted, if it did (the later rounds find none)."""
        context = self.context
        begun = self.first.take() or _submit(
            context, prompt_tokens, params, plan, save_points, pin=self.pin
        )
        # the header it most likely starts with, parsed while the prompt is evaluated (known
        # once the engine started it: a begun round's is); after the events queued so far
        # went out (the opening events: their writer runs first), and not once tokens came
        parsers = context.parsers
        asyncio.get_running_loop().call_soon(begun.decoder.expect, begun.stream.likely, parsers)
        reader = _HarmonyReader(
            context, begun, stops=self.stop, names=self.names, record=self.record, sampled=sampled
        )
        return context.rounds.run(begun.stream, reader)


def _submit(
    context: ChatContext,
    prompt_tokens: list[int],
    params: SamplingParams,
    plan: SteeringPlan,
    save_points: tuple[int, ...],
    *,
    pin: SlotPin | None,
) -> _Begun:
    """A round submitted: its steering, the engine's stream, and the decoder for it."""
    steering = plan.start()
    stream = context.rounds.submit(prompt_tokens, params, steering, save_points, pin)
    try:
        return _Begun(
            steering, stream, HarmonyDecoder(context.encoding, parser=context.parsers.take())
        )
    except BaseException:
        stream.cancel()
        raise


class FirstRound:
    """A generation's first round, submitted before its events are read: the core's one owner
    of that trick (a streamed response's headers and opening events are then made while the
    engine evaluates the prompt, and the engine thread's start does not wait for the GIL
    meanwhile). The events take the round over (`take`); `abandon` ends it where they never
    will."""

    def __init__(
        self,
        start: Callable[[], _Begun] | None,
        reader: Callable[[_Begun], _HarmonyReader],
        rounds: Rounds,
        ticket: Ticket | None,
    ) -> None:
        self._start = start  # None: nothing begins (approved calls run first)
        self._reader = reader  # what reports a round nobody read
        self._rounds = rounds
        self._ticket = ticket
        self._begun: _Begun | None = None

    async def begin(self, within_s: float = BEGIN_WAIT_S) -> None:
        """Submit the first round now, and wait until the engine evaluates it (`within_s` at
        most). A generation that first runs approved calls begins nothing: its first prompt
        waits for their results."""
        if self._start is None:
            return
        if self._begun is None:
            self._begun = self._start()
        await self._begun.stream.evaluating(within_s)  # at once when it already does

    def take(self) -> _Begun | None:
        """The begun round, for the events to read (once; None if none was begun)."""
        begun, self._begun = self._begun, None
        return begun

    def abandon(self) -> None:
        """The response ended before its events were read: a begun round is cancelled (and
        reported once the engine lets go of it, as a round its client left) and the admission
        place given back."""
        begun = self.take()
        if begun is not None:
            self._rounds.leave(begun.stream, self._reader(begun))
        if self._ticket is not None:
            self._ticket.release()


@dataclass(frozen=True, slots=True)
class _Begun:
    """A round submitted: its steering, the engine's stream, and the decoder for it."""

    steering: HarmonySteering
    stream: TokenStream
    decoder: HarmonyDecoder


class _HarmonyReader:
    """A chat-style round's chunks -> the client's events (server.core.rounds.Reader): harmony
    decoded, stop strings applied, tool names mapped back; the history recorded at its end."""

    def __init__(
        self,
        context: ChatContext,
        begun: _Begun,
        *,
        stops: tuple[str, ...],
        names: ToolNames | None,
        record: bool,
        sampled: list[int] | None = None,
    ) -> None:
        self._context = context
        self._record = record
        self._begun = begun
        self._sampled = sampled
        self._client = ClientEvents(begun.decoder, StopStrings(stops), names)

    @property
    def stop(self) -> str | None:
        return self._client.stop_sequence

    def feed(self, chunk: TokenChunk) -> Iterator[GenerationEvent]:
        if self._sampled is not None:
            self._sampled.extend(chunk)
        return self._client.feed(chunk, chunk.logprobs)

    def let_go(self, *, read: bool) -> None:
        if read:  # the next generation's parser, made after this one's last events are queued
            asyncio.get_running_loop().call_soon(self._context.parsers.restock)

    def tail(self) -> Iterator[GenerationEvent]:
        if not self._client.stopped:
            yield from self._client.finish()
        if self._record:
            self._context.history.record(self._client.ended)

    def finished(self, result: EngineResult, stop: str | None) -> Finished:
        decoder, steering = self._begun.decoder, self._begun.steering
        finished = finished_event(result, decoder.reasoning_tokens, stopped=stop)
        if decoder.left_grammar or steering.left_grammar:  # logged without the model's text
            log.warning(
                "the model's output left the harmony grammar (%s); the response ends with what "
                "was parsed",
                "the parser gave up" if decoder.left_grammar else "steering was switched off",
            )
            finished = dataclasses.replace(finished, malformed=True)
        return finished


@dataclass(frozen=True)
class _Start:
    """Where a response's rounds start: the first prompt, its parameters, steering and save
    points, and the server-run calls already made (approved ones)."""

    prompt: list[int]
    params: SamplingParams
    plan: SteeringPlan
    points: tuple[int, ...]
    calls: int = 0


async def _releasing(
    events: AsyncGenerator[GenerationEvent, None], ticket: Ticket
) -> AsyncIterator[GenerationEvent]:
    """The events; the request's admission place is given back when they end or are left."""
    try:
        async with aclosing(events) as inner:
            async for event in inner:
                yield event
    finally:
        ticket.release()
