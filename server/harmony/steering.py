"""HarmonySteering: keeps sampled output inside harmony's grammar and the request's rules.

Runs on the engine thread, token by token. Message headers are sampled from a token trie of the
headers this request allows (channels, the tools offered, tool_choice; every well-formed header
form gpt-oss writes for them, see `_call_headers`); content is sampled by
llama.cpp with the tokens that cannot occur there banned (structural specials, the wrong
terminator), the final answer follows a response-format grammar when one is asked for, and a
reasoning budget ends the analysis by forcing the next header. A token from outside the grammar
(only a test hook can produce one) switches steering off for the rest of the generation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from openai_harmony import HarmonyEncoding

from server.contracts.directives import Allow, Constrain, Directive, Force
from server.contracts.events import SegmentKind
from server.contracts.transcript import ToolChoice
from server.harmony.tokens import CALL, END, RETURN, SPECIALS, START

TERMINATOR = {
    SegmentKind.REASONING: END,
    SegmentKind.PREAMBLE: END,
    SegmentKind.TOOL_CALL: CALL,
    SegmentKind.FINAL: RETURN,
}
CALL_BANNED = SPECIALS - {CALL}
# the recipients of harmony's built-in tools, as gpt-oss was trained to address them: the python
# tool is addressed by its bare name, the browser by its functions
BUILTIN_RECIPIENTS: dict[str, tuple[str, ...]] = {
    "python": ("python",),
    "browser": ("browser.search", "browser.open", "browser.find"),
}
_Header = tuple[list[int], SegmentKind, "Constrain | None"]


@dataclass
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    kind: SegmentKind | None = None  # set on the node reached by <|message|>
    content: Constrain | None = None  # this header's own content constraint (a tool's grammar)
    allowed: tuple[int, ...] = ()


def _build_trie(headers: Sequence[_Header]) -> _Node:
    root = _Node()
    for tokens, kind, content in headers:
        node = root
        for token in tokens:
            node = node.children.setdefault(token, _Node())
        node.kind = kind
        node.content = content
    _freeze(root)
    return root


def _freeze(node: _Node) -> None:
    node.allowed = tuple(sorted(node.children))
    for child in node.children.values():
        _freeze(child)


@dataclass(frozen=True)
class SteeringPlan:
    """What one request allows; built once per request, shared by its steering state."""

    header_trie: _Node
    header_trie_after_budget: _Node
    content: dict[SegmentKind, Constrain]
    reasoning_budget: int | None
    budget_force: tuple[int, ...]
    assistant: int  # the role token after <|start|>
    likely_header: tuple[int, ...] = ()  # the header gpt-oss writes first: its reasoning's

    def start(self) -> HarmonySteering:
        return HarmonySteering(self)


def builtin_recipients(names: Sequence[str]) -> list[str]:
    """The recipients the model may address for the built-in tools `names`."""
    return [recipient for name in names for recipient in BUILTIN_RECIPIENTS.get(name, ())]


def plan_steering(
    encoding: HarmonyEncoding,
    recipients: Sequence[str],
    tool_choice: ToolChoice,
    *,
    final_grammar: str | None = None,
    reasoning_budget: int | None = None,
    call_grammars: Mapping[str, str] | None = None,
) -> SteeringPlan:
    """The plan for a request offering `recipients` (e.g. "functions.get_weather").

    `call_grammars` maps a recipient to the GBNF grammar its call's content follows (under
    every header form of the call); the grammar ends before `<|call|>`.
    Plans are immutable (each request walks them with its own HarmonySteering), so requests of
    the same shape (same tools, tool_choice, grammars, budget) share one: building it encodes
    every header and costs about as much as rendering the prompt.
    """
    grammars = tuple(sorted((call_grammars or {}).items()))
    return _plan(
        encoding,
        tuple(recipients),
        tool_choice,
        final_grammar=final_grammar,
        reasoning_budget=reasoning_budget,
        call_grammars=grammars,
    )


@functools.lru_cache(maxsize=256)
def _plan(
    encoding: HarmonyEncoding,
    recipients: tuple[str, ...],
    tool_choice: ToolChoice,
    *,
    final_grammar: str | None,
    reasoning_budget: int | None,
    call_grammars: tuple[tuple[str, str], ...],
) -> SteeringPlan:
    offered = _callable(recipients, tool_choice)
    kinds = _allowed_kinds(bool(recipients), tool_choice)
    headers = _headers(encoding, kinds, offered, dict(call_grammars))
    after_budget = [h for h in headers if h[1] is not SegmentKind.REASONING]
    start_assistant = encoding.encode("<|start|>assistant", allowed_special="all")
    force = [END, *start_assistant]
    if SegmentKind.FINAL in kinds:
        force += encoding.encode("<|channel|>final<|message|>", allowed_special="all")
    content = {kind: Constrain(banned=SPECIALS - {TERMINATOR[kind]}) for kind in TERMINATOR}
    content[SegmentKind.FINAL] = Constrain(banned=SPECIALS - {RETURN}, grammar=final_grammar)
    reasoning = [tokens for tokens, kind, _ in headers if kind is SegmentKind.REASONING]
    return SteeringPlan(
        header_trie=_build_trie(headers),
        header_trie_after_budget=_build_trie(after_budget),
        content=content,
        reasoning_budget=reasoning_budget,
        budget_force=tuple(force),
        assistant=start_assistant[-1],
        likely_header=tuple(reasoning[0]) if reasoning else (),
    )


def _callable(recipients: Sequence[str], choice: ToolChoice) -> list[str]:
    if choice.mode == "none":
        return []
    if choice.mode == "named":
        return [r for r in recipients if r == f"{choice.namespace}.{choice.name}"]
    return list(recipients)


def _allowed_kinds(has_tools: bool, choice: ToolChoice) -> set[SegmentKind]:
    """What may be written: reasoning always; a final answer unless a call is forced; calls and
    preambles when tools are offered and not refused. A forced call (`required`, `named`) allows
    no preamble: after its reasoning the model's next message is the call, as OpenAI's and
    Anthropic's APIs promise."""
    kinds = {SegmentKind.REASONING}
    if choice.mode in ("auto", "none"):
        kinds.add(SegmentKind.FINAL)
    if has_tools and choice.mode == "auto":
        kinds.add(SegmentKind.PREAMBLE)
    if has_tools and choice.mode != "none":
        kinds.add(SegmentKind.TOOL_CALL)
    return kinds


def _headers(
    encoding: HarmonyEncoding,
    kinds: set[SegmentKind],
    recipients: Sequence[str],
    call_grammars: Mapping[str, str],
) -> list[_Header]:
    texts: list[tuple[str, SegmentKind, Constrain | None]] = []
    if SegmentKind.REASONING in kinds:
        texts.append(("<|channel|>analysis<|message|>", SegmentKind.REASONING, None))
    if SegmentKind.FINAL in kinds:
        texts.append(("<|channel|>final<|message|>", SegmentKind.FINAL, None))
    if SegmentKind.PREAMBLE in kinds:
        texts.append(("<|channel|>commentary<|message|>", SegmentKind.PREAMBLE, None))
    if SegmentKind.TOOL_CALL in kinds:
        for recipient in recipients:
            grammar = call_grammars.get(recipient)
            content = None if grammar is None else Constrain(CALL_BANNED, grammar)
            for text in _call_headers(recipient):
                texts.append((text, SegmentKind.TOOL_CALL, content))
    encoded = _encode_all(encoding, [text for text, _, _ in texts])
    return [(tokens, kind, c) for tokens, (_, kind, c) in zip(encoded, texts, strict=True)]


_SPECIAL_TOKEN = re.compile(r"(<\|[a-z_]+\|>)")


def _encode_all(encoding: HarmonyEncoding, texts: Sequence[str]) -> list[list[int]]:
    """The tokens of each text, as `encoding.encode` gives them; the text between special tokens
    is encoded once per distinct piece (BPE never merges across a special token), since the
    headers of many tools share most of their pieces."""
    pieces: dict[str, list[int]] = {}
    encoded = []
    for text in texts:
        tokens: list[int] = []
        for piece in _SPECIAL_TOKEN.split(text):
            if piece and piece not in pieces:
                pieces[piece] = encoding.encode(piece, allowed_special="all")
            tokens.extend(pieces.get(piece, ()))
        encoded.append(tokens)
    return encoded


# How gpt-oss writes a call header, as real outputs show it: the recipient after the channel or
# in the role; the call on the commentary channel (harmony's rule) or on the analysis channel;
# the content type `<|constrain|>json` (with or without a space before it), a bare `json` or
# `code`, or none. All parse as the same call (harmony's parser) and replay keeps the exact
# tokens, so steering lets the model write the form it chose instead of pushing it onto a less
# likely one; a tool's grammar governs the call's content whatever type the header declares.
_CALL_CHANNELS = ("commentary", "analysis")
_CONTENT_TYPES = (" <|constrain|>json", "<|constrain|>json", " json", " code", "")


def _call_headers(recipient: str) -> list[str]:
    """The call headers accepted for `recipient`."""
    headers = []
    for channel in _CALL_CHANNELS:
        for content_type in _CONTENT_TYPES:
            headers.append(f"<|channel|>{channel} to={recipient}{content_type}<|message|>")
            headers.append(f" to={recipient}<|channel|>{channel}{content_type}<|message|>")
    return headers


class _Phase(Enum):
    HEADER = 1
    CONTENT = 2
    AFTER_END = 3  # expects <|start|>
    AFTER_START = 4  # expects the role: assistant
    OFF = 5


class HarmonySteering:
    """The steering state of one generation (engine.base.Steering)."""

    def __init__(self, plan: SteeringPlan) -> None:
        self._plan = plan
        self._phase = _Phase.HEADER
        self._node = plan.header_trie
        self._kind = SegmentKind.FINAL
        self._content: Constrain | None = None
        self._reasoning_tokens = 0
        self._budget_spent = False
        self.left_grammar = False

    def next(self) -> Directive:
        phase = self._phase
        if phase is _Phase.CONTENT:
            if self._kind is SegmentKind.REASONING and self._over_budget():
                self._budget_spent = True
                return Force(self._plan.budget_force)
            return self._content or self._plan.content[self._kind]
        if phase is _Phase.HEADER:
            return Allow(self._node.allowed) if self._node.allowed else None
        if phase is _Phase.AFTER_END:
            return Allow((START,))
        if phase is _Phase.AFTER_START:
            return Allow((self._plan.assistant,))
        return None

    def likely(self) -> tuple[int, ...]:
        """Within the header at its root's trie: the rest of the reasoning header from here
        (`analysis<|message|>` after `<|channel|>`, gpt-oss's usual first message); else ()."""
        if self._phase is not _Phase.HEADER:
            return ()
        node = self._plan.header_trie
        path = self._plan.likely_header
        for i, token in enumerate(path):
            if node is self._node:
                return path[i:] if self._node.children.get(token) is not None else ()
            child = node.children.get(token)
            if child is None:
                return ()
            node = child
        return ()

    def accept(self, token: int) -> None:
        phase = self._phase
        if phase is _Phase.CONTENT:
            self._accept_content(token)
        elif phase is _Phase.HEADER:
            self._accept_header(token)
        elif phase is _Phase.AFTER_END:
            self._expect(token == START, _Phase.AFTER_START)
        elif phase is _Phase.AFTER_START:
            self._expect(token == self._plan.assistant, _Phase.HEADER)
            self._node = self._root()

    def _accept_content(self, token: int) -> None:
        if token == END:
            self._phase = _Phase.AFTER_END
        elif self._kind is SegmentKind.REASONING:
            self._reasoning_tokens += 1

    def _accept_header(self, token: int) -> None:
        child = self._node.children.get(token)
        if child is None:
            self._leave()
            return
        self._node = child
        if child.kind is not None:
            self._kind = child.kind
            self._content = child.content
            self._phase = _Phase.CONTENT

    def _expect(self, ok: bool, phase: _Phase) -> None:
        if ok:
            self._phase = phase
        else:
            self._leave()

    def _leave(self) -> None:
        self._phase = _Phase.OFF
        self.left_grammar = True

    def _root(self) -> _Node:
        return self._plan.header_trie_after_budget if self._budget_spent else self._plan.header_trie

    def _over_budget(self) -> bool:
        budget = self._plan.reasoning_budget
        return budget is not None and not self._budget_spent and self._reasoning_tokens >= budget
