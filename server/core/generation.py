"""The generation core shared by every endpoint: Transcript -> prompt -> engine -> events.

`Generator.prepare()` renders the prompt and rejects what cannot run (before any HTTP response
has started); `Prepared.events()` streams decoder events while the engine samples and ends with
exactly one `Finished` event, also on cancellation and engine errors. When summaries are asked
for, the events of a short summary generation per reasoning segment are merged in
(server.core.summaries).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from openai_harmony import HarmonyEncoding

from server.contracts.errors import (
    ContextLengthExceeded,
    EngineUnavailable,
    InvalidRequest,
    RequestField,
    ServerBusy,
)
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentStart,
    TokenLogprob,
    ToolOutput,
)
from server.contracts.transcript import ResponseFormat, ToolChoice, Transcript
from server.core.admission import Admission, Ticket
from server.core.history import History
from server.core.stop_strings import StopStrings
from server.core.summaries import SummaryConfig, SummaryMerge, summary_transcript
from server.core.tool_loop import ServerTools, merged, server_call, shifted
from server.core.tool_names import ToolNames
from server.core.visibility import SummaryStyle
from server.engine.base import Engine, EngineResult, SamplingParams, StopReason, TokenStream
from server.grammars.response_format import answer_grammar
from server.grammars.tools import call_grammar
from server.harmony.decoder import HarmonyDecoder
from server.harmony.render import tool_message_tokens
from server.harmony.renderer import Renderer
from server.harmony.steering import (
    HarmonySteering,
    SteeringPlan,
    builtin_recipients,
    plan_steering,
)
from server.harmony.token_bytes import TokenBytes
from server.harmony.tokens import CALL as CALL_TOKEN
from server.harmony.tokens import END as END_TOKEN
from server.harmony.tokens import MESSAGE_TERMINATORS as TERMINATORS

log = logging.getLogger(__name__)

SEED_RANGE = 1 << 64  # any integer seed (OpenAI allows negative ones) maps into the engine's


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """What a request asks of generation; None means the server's default."""

    max_tokens: int | None = None  # all output tokens, reasoning included
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0 = no top-k cut
    seed: int | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    reasoning_budget: int | None = None  # analysis tokens before the answer is forced to start
    stop: tuple[str, ...] = ()  # strings that end the final answer
    summary: SummaryStyle | None = None  # summarize each reasoning segment in this style
    logprobs: int | None = None  # content tokens' logprobs on the deltas, with this many others


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0


class Generator:
    """Owns the engine and the encoding; one per app."""

    def __init__(
        self,
        engine: Engine,
        encoding: HarmonyEncoding,
        defaults: SamplingDefaults | None = None,
        history: History | None = None,
        on_finished: Callable[[Finished], None] | None = None,
        *,
        summaries: SummaryConfig | None = None,
        strict_tools: bool = True,
        stream_interval_s: float = 0.0,
    ) -> None:
        self.engine = engine
        self.encoding = encoding
        self.renderer = Renderer(encoding)  # remembers renders across requests
        self.defaults = defaults or SamplingDefaults()
        start = list(self.renderer.assistant_start)
        self.history = history if history is not None else History(start)
        self.on_finished = on_finished  # e.g. metrics; called once per generation (summaries too)
        self.summaries = summaries or SummaryConfig()
        load = engine.load
        self.admission = Admission(load.slots, load.max_waiting)
        self._stop_tokens = frozenset(encoding.stop_tokens_for_assistant_actions())
        self._developer_start = encoding.encode("<|start|>developer", allowed_special="all")
        self._user_start = encoding.encode("<|start|>user<|message|>", allowed_special="all")
        self.strict_tools = strict_tools  # enforce schemas of tools that do not say `strict`
        self.stream_interval_s = stream_interval_s  # engine chunks at most this often
        self._checked_grammars: dict[str, bool] = {}  # grammar -> llama.cpp accepts it

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's bytes (read once, when logprobs are first asked for)."""
        return TokenBytes.load(self.encoding)

    def prepare(
        self,
        transcript: Transcript,
        options: GenerationOptions,
        tools: ServerTools | None = None,
    ) -> Prepared:
        """Render and validate; raises InvalidRequest / ContextLengthExceeded / ServerBusy.

        Errors name logical request fields (RequestField); the adapter names them on the wire.
        `tools`: the tools the server runs itself in this generation (server.core.tool_loop).
        """
        failure = self.engine.failure
        if failure is not None:
            raise EngineUnavailable(f"The server cannot generate: {failure}")
        ticket = self.admission.try_acquire()
        if ticket is None:
            raise ServerBusy(self.admission.waiting)
        try:
            prepared = self._prepare(transcript, options, ticket, tools)
        except BaseException:
            ticket.release()
            raise
        # A response that never starts streaming (its client left first) still gives its place
        # back, when the Prepared is dropped; release() is idempotent.
        weakref.finalize(prepared, ticket.release)
        return prepared

    def _prepare(
        self,
        transcript: Transcript,
        options: GenerationOptions,
        ticket: Ticket,
        tools: ServerTools | None = None,
    ) -> Prepared:
        names = ToolNames(transcript.tools)
        transcript, prompt_tokens = self._render(transcript, names)
        n_ctx = self.engine.info.n_ctx
        room = n_ctx - len(prompt_tokens)
        if room <= 0:
            raise ContextLengthExceeded(
                f"This model's context window is {n_ctx} tokens; the prompt has "
                f"{len(prompt_tokens)}. Shorten the conversation or restart the server with a "
                "larger --n-ctx.",
                field=RequestField.CONVERSATION,
            )
        params = self._sampling(options, room)
        steering = self._steering(transcript, names.to_harmony_choice(options.tool_choice), options)
        points = self.save_points(prompt_tokens)
        later: tuple[SteeringPlan, SteeringPlan] | None = None
        if tools is not None:  # after a tool round: tool_choice has been honoured
            may_call = ToolChoice() if options.tool_choice.mode != "none" else options.tool_choice
            later = (
                self._steering(transcript, may_call, options),
                self._steering(transcript, ToolChoice(mode="none"), options),
            )
        return Prepared(
            self,
            prompt_tokens,
            params,
            steering,
            options.stop,
            names,
            options.summary,
            ticket,
            save_points=points,
            tools=tools,
            later_steering=later,
        )

    def count_tokens(self, transcript: Transcript) -> int:
        """How many tokens the prompt of `transcript` has, rendered as `prepare` would."""
        return len(self._render(transcript, ToolNames(transcript.tools))[1])

    def _render(self, transcript: Transcript, names: ToolNames) -> tuple[Transcript, list[int]]:
        """The transcript as the model sees it (exact tokens replayed, tools renamed), and its
        prompt."""
        seen = names.to_harmony(self.history.apply(transcript))
        return seen, self.renderer.render(seen)

    def save_points(self, prompt_tokens: list[int]) -> tuple[int, ...]:
        """Prompt lengths worth keeping on disk once evaluated: the end of the system +
        developer block (instructions and tools: shared by every conversation of a client) and
        the start of the last user message's text (shared by a new conversation of the same
        client in the same environment, and by an edited last message)."""
        points = set()
        first_end = _find(prompt_tokens, END_TOKEN)
        if first_end >= 0:
            head = first_end + 1
            after = prompt_tokens[head : head + len(self._developer_start)]
            second_end = _find(prompt_tokens, END_TOKEN, head)
            developer = after == self._developer_start and second_end >= 0
            points.add(second_end + 1 if developer else head)
        user = self._user_start
        last_user = -1
        at = _find(prompt_tokens, user[0])
        while at >= 0:  # messages start there: a few per prompt (list.index scans in C)
            if prompt_tokens[at : at + len(user)] == user:
                last_user = at
            at = _find(prompt_tokens, user[0], at + 1)
        if last_user >= 0:
            points.add(last_user + len(user))
        return tuple(sorted(points))

    def summary(self, reasoning: str, style: SummaryStyle) -> Prepared | None:
        """The summary generation of a chain of thought; None if its prompt cannot fit.

        Not subject to the waiting-room limit (it belongs to a request already admitted) and
        not recorded in the history (nobody sends it back as a message).
        """
        config = self.summaries
        prompt_tokens = self.renderer.render(summary_transcript(reasoning, style, config))
        room = self.engine.info.n_ctx - len(prompt_tokens)
        if room < 1:
            log.warning("a reasoning summary was skipped: its prompt does not fit the context")
            return None
        params = self._sampling(GenerationOptions(max_tokens=config.max_tokens), room)
        steering = plan_steering(
            self.encoding, [], ToolChoice(mode="none"), reasoning_budget=config.reasoning_budget
        )
        return Prepared(self, prompt_tokens, params, steering, record=False)

    def _sampling(self, options: GenerationOptions, room: int) -> SamplingParams:
        if options.max_tokens is not None and options.max_tokens < 1:
            raise InvalidRequest("max tokens must be at least 1", field=RequestField.MAX_TOKENS)
        return SamplingParams(
            max_tokens=min(options.max_tokens or room, room),
            temperature=_pick(options.temperature, self.defaults.temperature),
            top_p=_pick(options.top_p, self.defaults.top_p),
            top_k=self.defaults.top_k if options.top_k is None else options.top_k,
            min_p=self.defaults.min_p,
            seed=None if options.seed is None else options.seed % SEED_RANGE,
            stop_tokens=self._stop_tokens,
            logprobs=options.logprobs,
        )

    def _steering(
        self, transcript: Transcript, choice: ToolChoice, options: GenerationOptions
    ) -> SteeringPlan:
        recipients = [spec.recipient for spec in transcript.tools]
        recipients += builtin_recipients([tool.name for tool in transcript.builtin_tools])
        if choice.mode in ("required", "named") and not recipients:
            raise InvalidRequest(
                f"tool_choice {choice.mode!r} needs tools", field=RequestField.TOOL_CHOICE
            )
        if choice.mode == "named" and f"{choice.namespace}.{choice.name}" not in recipients:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not among the tools",
                field=RequestField.TOOL_CHOICE,
            )
        if options.reasoning_budget is not None and options.reasoning_budget < 1:
            raise InvalidRequest(
                "the reasoning budget must be positive", field=RequestField.REASONING
            )
        return plan_steering(
            self.encoding,
            recipients,
            choice,
            final_grammar=self._final_grammar(transcript.response_format),
            reasoning_budget=options.reasoning_budget,
            call_grammars=self._call_grammars(transcript),
        )

    def _call_grammars(self, transcript: Transcript) -> dict[str, str]:
        """The grammar each tool's call content is sampled under (tools without one: free)."""
        grammars = {}
        for spec in transcript.tools:
            grammar = call_grammar(spec, self.strict_tools)
            if grammar is not None and self._usable(grammar, spec.recipient):
                grammars[spec.recipient] = grammar
        return grammars

    def _usable(self, grammar: str, recipient: str) -> bool:
        usable = self._checked_grammars.get(grammar)
        if usable is None:
            try:
                self.engine.validate_grammar(grammar)
                usable = True
            except ValueError:
                log.warning("llama.cpp rejected tool %s's grammar; its calls are free", recipient)
                usable = False
            if len(self._checked_grammars) > 1024:
                self._checked_grammars.clear()
            self._checked_grammars[grammar] = usable
        return usable

    def _final_grammar(self, response_format: ResponseFormat | None) -> str | None:
        if response_format is None:
            return None
        try:
            grammar = answer_grammar(response_format)
            self.engine.validate_grammar(grammar)
        except ValueError as exc:
            raise InvalidRequest(
                f"the response format's JSON schema cannot be enforced: {exc}",
                field=RequestField.RESPONSE_FORMAT,
            ) from exc
        return grammar


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
        if self.tools is None or self.later_steering is None:
            rounds = self._round(self.prompt_tokens, self.params, self.steering, self.save_points)
        else:
            rounds = self._tool_rounds(self.tools, self.later_steering)
        async with aclosing(rounds) as events:
            async for event in events:
                yield event

    async def _tool_rounds(
        self, tools: ServerTools, later: tuple[SteeringPlan, SteeringPlan]
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Rounds of generation while the model calls server-run tools (see tool_loop)."""
        generator = self.generator
        prompt, params, plan, points = (
            self.prompt_tokens,
            self.params,
            self.steering,
            self.save_points,
        )
        offset, calls = 0, 0
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
            result = await tools.run(call.target, call.text)
            channel = tools.result_channel(call)
            result_tokens = tool_message_tokens(
                generator.encoding, call.recipient, result.text, channel
            )
            yield ToolOutput(
                index=call.index + offset,
                call_id=call.call_id or "",
                target=call.target,
                arguments=call.text,
                text=result.text,
                is_error=result.is_error,
                details=dict(result.item),
                tokens=tuple(result_tokens),
                channel=channel,
            )
            offset += n_segments
            prompt = [*prompt, *sampled, *result_tokens, *generator.renderer.assistant_start]
            room = generator.engine.info.n_ctx - len(prompt)
            left = params.max_tokens - finished.usage.completion_tokens
            if room <= 0 or left <= 0:
                yield dataclasses.replace(total, reason=FinishReason.LENGTH)
                return
            params = dataclasses.replace(params, max_tokens=min(left, room))
            plan = later[1] if calls >= tools.max_calls else later[0]
            points = ()

    async def _round(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        plan: SteeringPlan,
        save_points: tuple[int, ...],
        sampled: list[int] | None = None,
    ) -> AsyncGenerator[GenerationEvent, None]:
        """One engine generation: its events, then its Finished. `sampled` gets every token
        the engine sampled (a server-run tool's round appends to them)."""
        steering = plan.start()
        stream, decoder = self._submit(steering, prompt_tokens, params, save_points)
        client = ClientEvents(decoder, StopStrings(self.stop), self.names)
        consumed = False
        try:
            async for chunk in stream.paced(self.generator.stream_interval_s):
                if sampled is not None:
                    sampled.extend(chunk)
                for event in client.feed(chunk, chunk.logprobs):
                    yield event
                if client.stopped:
                    break
            consumed = True
        finally:
            stream.cancel()  # no-op once finished; stops the engine if the consumer left
            if not consumed and not client.stopped:
                stream.on_close(
                    lambda result: self._report(result, decoder, steering, stopped=None)
                )
        if client.stopped:
            async for _ in stream:  # the engine stops within a token; wait for its result
                pass
        else:
            for event in client.finish():
                yield event
        if self.record:
            self.generator.history.record(client.ended)
        yield self._report(stream.result, decoder, steering, stopped=client.stop_sequence)

    def _submit(
        self,
        steering: HarmonySteering,
        prompt_tokens: list[int],
        params: SamplingParams,
        save_points: tuple[int, ...],
    ) -> tuple[TokenStream, HarmonyDecoder]:
        """The engine's stream, and the decoder for it (built while the prompt is evaluated)."""
        stream = self.generator.engine.submit(prompt_tokens, params, steering, save_points)
        try:
            return stream, HarmonyDecoder(self.generator.encoding)
        except BaseException:
            stream.cancel()
            raise

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


class ClientEvents:
    """Sampled token ids -> the events a client sees, one engine chunk at a time.

    The decoder parses the tokens, stop strings cut the final answer, and tool names go back to
    the client's names; consecutive deltas of one segment in a chunk are joined (one delta per
    segment and chunk goes out, not one per token). Once a stop string matched, nothing more
    is decoded. Where the request asked for logprobs, each content token's (the tokens of a
    segment after its header, before its terminator) goes out with the next delta of its segment.
    """

    def __init__(
        self, decoder: HarmonyDecoder, stops: StopStrings, names: ToolNames | None
    ) -> None:
        self._decoder = decoder
        self._stops = stops
        self._names = names
        self.ended: list[SegmentEnd] = []  # messages completed while sampling (the history's)
        self._open = False  # a segment's content is being sampled
        self._scores: list[TokenLogprob] = []  # content tokens not yet sent with a delta

    @property
    def stopped(self) -> bool:
        """A stop string matched: the generation must end."""
        return self._stops.hit

    @property
    def stop_sequence(self) -> str | None:
        return self._stops.matched

    def feed(
        self, tokens: list[int], logprobs: Sequence[TokenLogprob | None] = ()
    ) -> Iterator[GenerationEvent]:
        texts: list[SegmentDelta] = []
        pending: SegmentDelta | None = None
        for event in self._filtered(tokens, logprobs):
            if (
                isinstance(event, SegmentDelta)
                and pending is not None
                and event.index == pending.index
            ):
                texts.append(event)
                continue
            if pending is not None:
                yield self._for_client(_joined(pending, texts))
                pending = None
            if isinstance(event, SegmentDelta):
                pending, texts = event, [event]
            else:
                yield self._for_client(event)
        if pending is not None:
            yield self._for_client(_joined(pending, texts))

    def finish(self) -> Iterator[GenerationEvent]:
        """What the decoder still holds once the engine stopped (not after a stop string)."""
        for event in self._decoder.finish():
            for passed in self._stops.filter(event):
                yield self._for_client(passed)

    def _filtered(
        self, tokens: list[int], logprobs: Sequence[TokenLogprob | None]
    ) -> Iterator[GenerationEvent]:
        for at, token in enumerate(tokens):
            score = logprobs[at] if at < len(logprobs) else None
            if score is not None and self._open and token not in TERMINATORS:
                self._scores.append(score)
            for event in self._decoder.feed(token):
                if isinstance(event, SegmentStart | SegmentEnd):
                    self._open = isinstance(event, SegmentStart)
                for passed in self._stops.filter(event):
                    if isinstance(passed, SegmentEnd):  # complete messages only: the history
                        self.ended.append(passed)
                        self._scores = []
                    yield self._scored(passed)
                if self._stops.hit:
                    return

    def _scored(self, event: GenerationEvent) -> GenerationEvent:
        """A delta with the logprobs of the content tokens it is the text of."""
        if not isinstance(event, SegmentDelta) or not self._scores:
            return event
        scores, self._scores = tuple(self._scores), []
        return dataclasses.replace(event, logprobs=scores)

    def _for_client(self, event: GenerationEvent) -> GenerationEvent:
        return self._names.to_client(event) if self._names is not None else event


def _joined(first: SegmentDelta, deltas: list[SegmentDelta]) -> SegmentDelta:
    if len(deltas) == 1:
        return first
    text = "".join(d.text for d in deltas)
    return dataclasses.replace(
        first, text=text, logprobs=tuple(lp for d in deltas for lp in d.logprobs)
    )


def _find(tokens: list[int], token: int, start: int = 0) -> int:
    """The first position of `token` at or after `start`, or -1."""
    try:
        return tokens.index(token, start)
    except ValueError:
        return -1


def finished_event(result: EngineResult, reasoning_tokens: int, *, stopped: str | None) -> Finished:
    """The generation's last event. `stopped`: the stop string that ended the answer, if one
    did."""
    return Finished(
        reason=FinishReason.STOP if stopped is not None else finish_reason(result),
        usage=dataclasses.replace(result.usage, reasoning_tokens=reasoning_tokens),
        timings=result.timings,
        error=result.error,
        stop_sequence=stopped,
        steering=result.steering,
    )


def finish_reason(result: EngineResult) -> FinishReason:
    if result.stop_reason is StopReason.STOP_TOKEN:
        return FinishReason.TOOL_CALL if result.stop_token == CALL_TOKEN else FinishReason.STOP
    if result.stop_reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL):
        return FinishReason.LENGTH
    if result.stop_reason is StopReason.CANCELLED:
        return FinishReason.CANCELLED
    return FinishReason.ERROR


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value
