"""Prepared: one admitted generation, run as events.

`Prepared.events()` streams decoder events while the engine samples and ends with exactly one
`Finished` event, also on cancellation and engine errors. When summaries are asked for, the
events of a short summary generation per reasoning segment are merged in (server.core.summaries).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentStart,
    ToolOutput,
)
from server.core.admission import Ticket
from server.core.client_events import ClientEvents
from server.core.finish import finished_event
from server.core.stop_strings import StopStrings
from server.core.summaries import SummaryMerge
from server.core.tool_loop import ServerCall, ServerTools, merged, server_call, shifted
from server.core.tool_names import ToolNames
from server.core.visibility import SummaryStyle
from server.engine.base import EngineResult, SamplingParams, TokenStream
from server.harmony.decoder import HarmonyDecoder
from server.harmony.steering import HarmonySteering, SteeringPlan

if TYPE_CHECKING:
    from server.core.generation import Generator

log = logging.getLogger(__name__)

BEGIN_WAIT_S = 0.02  # `begin` waits this long at most for the engine to take the generation


@dataclass(frozen=True)
class Prepared:
    """A validated generation, ready to run."""

    generator: Generator
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
    # the first round, submitted by `begin` before the events are read
    _begun: list[tuple[HarmonySteering, TokenStream, HarmonyDecoder]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    async def begin(self, within_s: float = BEGIN_WAIT_S) -> None:
        """Submit the first round now, and wait until the engine evaluates it (`within_s` at
        most): what a response builds before its first events (the Responses snapshots, chat's
        role chunk) is then built while the prompt is evaluated, and the engine thread's start
        does not wait for the GIL meanwhile. `events()` takes the round over; `abandon` ends it
        if they are never read. A generation that first runs approved calls begins nothing:
        its first prompt waits for their results."""
        if self.approved:
            return
        if not self._begun:
            first = self._start(self.prompt_tokens, self.params, self.steering, self.save_points)
            self._begun.append(first)
        await self._begun[0][1].evaluating(within_s)  # at once when it already does

    def abandon(self) -> None:
        """The response ended before its events were read: a begun round is cancelled (and
        reported once the engine lets go of it, as a round its client left) and the admission
        place given back."""
        for steering, stream, decoder in self._begun:
            stream.cancel()
            stream.on_close(functools.partial(self._left, decoder=decoder, steering=steering))
        self._begun.clear()
        if self.ticket is not None:
            self.ticket.release()

    def events(self) -> AsyncIterator[GenerationEvent]:
        """Decoder events while the engine samples (summary events merged in), then Finished.

        Complete messages are recorded in the history, so the next request can replay them.
        If the consumer leaves early, the engine requests are cancelled and still reported to
        `on_finished` once the engine lets go of them.
        """
        if self.summary is None:
            events = self._events()
        else:
            history = self.generator.history
            merge = SummaryMerge(self._events(), self._summary_events, history.record_summaries)
            events = merge.events()
        return events if self.ticket is None else _releasing(events, self.ticket)

    async def _summary_events(self, reasoning: str) -> AsyncIterator[GenerationEvent]:
        assert self.summary is not None
        prepared = self.generator.summary(reasoning, self.summary)
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
        generator = self.generator
        start = list(generator.renderer.assistant_start)
        prompt = self.prompt_tokens[: len(self.prompt_tokens) - len(start)]
        for approved in self.approved:
            output = await self._run(tools, approved, -1, "commentary")
            yield output
            prompt = [*prompt, *output.tokens]
        prompt = [*prompt, *start]
        calls = len(self.approved)
        room = generator.engine.info.n_ctx - len(prompt)
        if room <= 0:
            yield Finished(FinishReason.LENGTH)
            return
        first = _Start(
            prompt,
            dataclasses.replace(self.params, max_tokens=min(self.params.max_tokens, room)),
            later[1] if calls >= tools.max_calls else self.steering,
            generator.save_points(prompt),
            calls,
        )
        async with aclosing(self._tool_rounds(tools, later, first)) as events:
            async for event in events:
                yield event

    async def _tool_rounds(
        self, tools: ServerTools, later: tuple[SteeringPlan, SteeringPlan], first: _Start
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Rounds of generation while the model calls server-run tools (see tool_loop)."""
        generator = self.generator
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
            prompt = [*prompt, *sampled, *output.tokens, *generator.renderer.assistant_start]
            room = generator.engine.info.n_ctx - len(prompt)
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
        tokens = self.generator.renderer.tool_result_tokens(call.recipient, result.text, channel)
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

    async def _round(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        plan: SteeringPlan,
        save_points: tuple[int, ...],
        sampled: list[int] | None = None,
    ) -> AsyncGenerator[GenerationEvent, None]:
        """One engine generation: its events, then its Finished. `sampled` gets every token
        the engine sampled (a server-run tool's round appends to them). The first round takes
        over the one `begin` submitted, if it did (the later rounds find none)."""
        begun = self._begun.pop() if self._begun else None
        steering, stream, decoder = begun or self._start(prompt_tokens, params, plan, save_points)
        # the header it most likely starts with, parsed while the prompt is evaluated (known
        # once the engine started it: a begun round's is); after the events queued so far
        # went out (the opening events: their writer runs first), and not once tokens came
        asyncio.get_running_loop().call_soon(decoder.expect, stream.likely, self.generator.parsers)
        client = ClientEvents(decoder, StopStrings(self.stop), self.names)
        consumed = False
        try:
            async for chunk in stream.paced(self.generator.stream_interval_s):
                if sampled is not None:
                    sampled.extend(chunk)
                shown = False
                for event in client.feed(chunk, chunk.logprobs):
                    shown = shown or isinstance(event, SegmentDelta)
                    yield event
                if not shown:  # header tokens: the first text is not held to the interval
                    stream.unpace()
                if client.stopped:
                    break
            consumed = True
        finally:
            stream.cancel()  # no-op once finished; stops the engine if the consumer left
            if not consumed and not client.stopped:
                stream.on_close(functools.partial(self._left, decoder=decoder, steering=steering))
        # the next generation's parser, made after this one's last events are queued
        asyncio.get_running_loop().call_soon(self.generator.parsers.restock)
        if client.stopped:
            async for _ in stream:  # the engine stops within a token; wait for its result
                pass
        else:
            for event in client.finish():
                yield event
        if self.record:
            self.generator.history.record(client.ended)
        yield self._report(stream.result, decoder, steering, stopped=client.stop_sequence)

    def _start(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        plan: SteeringPlan,
        save_points: tuple[int, ...],
    ) -> tuple[HarmonySteering, TokenStream, HarmonyDecoder]:
        """A round submitted: its steering, the engine's stream, and the decoder for it."""
        steering = plan.start()
        stream = self.generator.engine.submit(prompt_tokens, params, steering, save_points)
        try:
            return (
                steering,
                stream,
                HarmonyDecoder(self.generator.encoding, parser=self.generator.parsers.take()),
            )
        except BaseException:
            stream.cancel()
            raise

    def _left(
        self, result: EngineResult, *, decoder: HarmonyDecoder, steering: HarmonySteering
    ) -> Finished:
        """The report of a round whose client left before its end."""
        return self._report(result, decoder, steering, stopped=None)

    def _report(
        self,
        result: EngineResult,
        decoder: HarmonyDecoder,
        steering: HarmonySteering,
        *,
        stopped: str | None,
    ) -> Finished:
        finished = finished_event(result, decoder.reasoning_tokens, stopped=stopped)
        if decoder.left_grammar or steering.left_grammar:  # logged without the model's text
            log.warning(
                "the model's output left the harmony grammar (%s); the response ends with what "
                "was parsed",
                "the parser gave up" if decoder.left_grammar else "steering was switched off",
            )
            finished = dataclasses.replace(finished, malformed=True)
        if self.generator.on_finished is not None:
            self.generator.on_finished(finished)
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
