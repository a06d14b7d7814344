"""The generation entry shared by every endpoint: Transcript -> prompt -> an admitted generation.

`Generator.prepare()` renders the prompt and rejects what cannot run (before any HTTP response
has started); the Prepared it returns runs as events (server.core.prepared), its rounds on the
engine loop the Generator hands to every generation (`Generator.rounds`: server.core.rounds).
Every generation a
client asks for, chat-style or raw (server.core.raw), comes in through `Generator.admit`: the
engine's health, a place in admission, and the sampling parameters, decided in one place
(`Generator.sampling`: the context's room, max tokens, the defaults, the effective temperature
an API echoes from `params`).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from openai_harmony import HarmonyEncoding

from server.contracts.errors import (
    ContextLengthExceeded,
    EngineUnavailable,
    InvalidRequest,
    RequestField,
    ServerBusy,
)
from server.contracts.events import Finished
from server.contracts.transcript import ResponseFormat, ToolChoice, Transcript
from server.core.admission import Admission, Ticket
from server.core.history import History
from server.core.prepared import ChatContext, Prepared
from server.core.rounds import Rounds
from server.core.save_points import SavePoints
from server.core.summaries import SummaryConfig, summary_transcript
from server.core.tool_loop import ServerTools, approved_calls
from server.core.tool_names import ToolNames
from server.core.visibility import SummaryStyle
from server.engine.base import Engine, SamplingParams, SlotPin
from server.grammars.response_format import answer_grammar
from server.grammars.tools import call_grammar
from server.harmony.decoder import ParserStock
from server.harmony.renderer import Renderer
from server.harmony.steering import SteeringPlan, builtin_recipients, plan_steering
from server.harmony.token_bytes import TokenBytes

log = logging.getLogger(__name__)

SEED_RANGE = 1 << 64  # any integer seed (OpenAI allows negative ones) maps into the engine's

A = TypeVar("A")  # an admitted generation (Prepared, RawGeneration)
V = TypeVar("V", int, float)


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


FORCED_CALL_REASONING_SHARE = 0.5  # of max_tokens, when a call is forced: the rest writes it


def reasoning_budget(choice: ToolChoice, options: GenerationOptions) -> int | None:
    """The analysis tokens allowed before the next header is forced: the request's budget, and
    when a call is forced (`required`, `named`) with a max_tokens, at most a share of it, so
    the reasoning ends in time for the call to be written (without it, a model that reasons
    to the limit answers a forced choice with no call)."""
    budget = options.reasoning_budget
    if choice.mode in ("required", "named") and options.max_tokens is not None:
        share = max(1, int(options.max_tokens * FORCED_CALL_REASONING_SHARE))
        budget = share if budget is None else min(budget, share)
    return budget


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None  # a request without a seed draws from this one (None: fresh draws)


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
        # the engine loop of every generation; reports to `on_finished` (e.g. metrics), once per
        # generation (summaries too), chunks at most every `stream_interval_s`
        self.rounds = Rounds(engine, stream_interval_s=stream_interval_s, on_finished=on_finished)
        self.renderer = Renderer(encoding)  # remembers renders across requests
        self.parsers = ParserStock(encoding, engine.load.slots)  # one ready per running stream
        self.defaults = defaults or SamplingDefaults()
        start = list(self.renderer.assistant_start)
        self.history = history if history is not None else History(start)
        self.summaries = summaries or SummaryConfig()
        load = engine.load
        self.admission = Admission(load.slots, load.max_waiting)
        self._stop_tokens = frozenset(encoding.stop_tokens_for_assistant_actions())
        self.save_points = SavePoints.of(encoding)  # where a prompt is saved on disk
        self.strict_tools = strict_tools  # enforce schemas of tools that do not say `strict`
        self._checked_grammars: dict[str, bool] = {}  # grammar -> llama.cpp accepts it
        self._chat = ChatContext(
            self.rounds,
            encoding,
            self.parsers,
            self.renderer,
            self.history,
            self.save_points,
            self.summary,
        )

    @property
    def on_finished(self) -> Callable[[Finished], None] | None:
        """Called with every generation's report (the rounds'); settable."""
        return self.rounds.on_finished

    @on_finished.setter
    def on_finished(self, hook: Callable[[Finished], None] | None) -> None:
        self.rounds.on_finished = hook

    @property
    def stream_interval_s(self) -> float:
        """Engine chunks are read at most this often (the rounds'); settable."""
        return self.rounds.stream_interval_s

    @stream_interval_s.setter
    def stream_interval_s(self, interval_s: float) -> None:
        self.rounds.stream_interval_s = interval_s

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's bytes (read once, when logprobs are first asked for)."""
        return TokenBytes.load(self.encoding)

    def admit(self, make: Callable[[Ticket], A]) -> A:
        """The one entry of every generation a client asks for: `make` validates and builds it
        holding a place in admission, which is given back if `make` raises, and otherwise when
        the generation ends or, if it never starts (its client left first), when it is
        dropped. Raises EngineUnavailable or ServerBusy before `make` runs."""
        failure = self.engine.failure
        if failure is not None:
            raise EngineUnavailable(f"The server cannot generate: {failure}")
        ticket = self.admission.try_acquire()
        if ticket is None:
            raise ServerBusy(self.admission.waiting)
        try:
            admitted = make(ticket)
        except BaseException:
            ticket.release()
            raise
        weakref.finalize(admitted, ticket.release)  # release() is idempotent
        return admitted

    def sampling(
        self,
        options: GenerationOptions,
        n_prompt: int,
        *,
        stop_tokens: frozenset[int] | None = None,
        prompt_only: bool = False,
        prompt_logprobs: bool = False,
    ) -> SamplingParams:
        """The engine's parameters for a prompt of `n_prompt` tokens: the request's values, the
        server's defaults where it gave none (what an API echoes as the effective temperature
        and top_p), max tokens within the context's room. `prompt_only`: max tokens 0 is allowed
        (the prompt is evaluated, nothing generated). Raises ContextLengthExceeded /
        InvalidRequest."""
        n_ctx = self.engine.info.n_ctx
        room = n_ctx - n_prompt
        if room <= 0:
            raise ContextLengthExceeded(
                n_prompt,
                n_ctx,
                hint="Or restart the server with a larger --n-ctx.",
                field=RequestField.CONVERSATION,
            )
        least = 0 if prompt_only else 1
        wanted = options.max_tokens
        if wanted is not None and wanted < least:
            raise InvalidRequest(
                f"max tokens must be at least {least}", field=RequestField.MAX_TOKENS
            )
        defaults = self.defaults
        seed = options.seed if options.seed is not None else defaults.seed
        return SamplingParams(
            max_tokens=room if wanted is None else min(wanted, room),
            temperature=_pick(options.temperature, defaults.temperature),
            top_p=_pick(options.top_p, defaults.top_p),
            top_k=_pick(options.top_k, defaults.top_k),
            min_p=defaults.min_p,
            seed=None if seed is None else seed % SEED_RANGE,
            stop_tokens=self._stop_tokens if stop_tokens is None else stop_tokens,
            logprobs=options.logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def prepare(
        self,
        transcript: Transcript,
        options: GenerationOptions,
        tools: ServerTools | None = None,
        *,
        pin: SlotPin | None = None,
    ) -> Prepared:
        """Render and validate; raises InvalidRequest / ContextLengthExceeded / ServerBusy.

        Errors name logical request fields (RequestField); the adapter names them on the wire.
        `tools`: the tools the server runs itself in this generation (server.core.tool_loop).
        `pin`: the conversation's claim on its engine slot (a Responses WebSocket's, for its
        life): every round of the generation runs in the slot it holds.
        """
        return self.admit(lambda ticket: self._prepare(transcript, options, ticket, tools, pin))

    def _prepare(
        self,
        transcript: Transcript,
        options: GenerationOptions,
        ticket: Ticket,
        tools: ServerTools | None = None,
        pin: SlotPin | None = None,
    ) -> Prepared:
        names = ToolNames(transcript.tools)
        given = transcript
        transcript, prompt_tokens = self._render(transcript, names)
        approved = approved_calls(given, transcript, tools) if tools is not None else ()
        params = self.sampling(options, len(prompt_tokens))
        steering = self._steering(transcript, names.to_harmony_choice(options.tool_choice), options)
        later: tuple[SteeringPlan, SteeringPlan] | None = None
        if tools is not None:  # after a tool round: tool_choice has been honoured
            may_call = ToolChoice() if options.tool_choice.mode != "none" else options.tool_choice
            later = (
                self._steering(transcript, may_call, options),
                self._steering(transcript, ToolChoice(mode="none"), options),
            )
        return Prepared(
            self._chat,
            prompt_tokens,
            params,
            steering,
            options.stop,
            names,
            options.summary,
            ticket,
            save_points=self.save_points(prompt_tokens),
            tools=tools,
            later_steering=later,
            approved=approved,
            pin=pin,
        )

    def count_tokens(self, transcript: Transcript) -> int:
        """How many tokens the prompt of `transcript` has, rendered as `prepare` would."""
        return len(self._render(transcript, ToolNames(transcript.tools))[1])

    def _render(self, transcript: Transcript, names: ToolNames) -> tuple[Transcript, list[int]]:
        """The transcript as the model sees it (exact tokens replayed, tools renamed), and its
        prompt."""
        seen = names.to_harmony(self.history.apply(transcript))
        return seen, self.renderer.render(seen)

    def summary(self, reasoning: str, style: SummaryStyle) -> Prepared | None:
        """The summary generation of a chain of thought; None if its prompt cannot fit.

        Not subject to the waiting-room limit (it belongs to a request already admitted) and
        not recorded in the history (nobody sends it back as a message).
        """
        config = self.summaries
        prompt_tokens = self.renderer.render(summary_transcript(reasoning, style, config))
        try:
            params = self.sampling(
                GenerationOptions(max_tokens=config.max_tokens), len(prompt_tokens)
            )
        except ContextLengthExceeded:
            log.warning("a reasoning summary was skipped: its prompt does not fit the context")
            return None
        steering = plan_steering(
            self.encoding, [], ToolChoice(mode="none"), reasoning_budget=config.reasoning_budget
        )
        return Prepared(self._chat, prompt_tokens, params, steering, record=False)

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
            reasoning_budget=reasoning_budget(choice, options),
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


def _pick(value: V | None, default: V) -> V:
    return default if value is None else value
