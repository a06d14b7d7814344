"""Renderer: render() with a memory across requests, owned by the Generator (app state).

A client sends the same system and developer messages on every turn (Codex's instructions and
tools take ≈ 6 ms to render: most of a request's preparation), and every earlier message of the
conversation again. Their renders are remembered, least recently used dropped beyond a number of
tokens, so a turn renders only what is new. Same transcript, same tokens as render().

What is new (a user's message, a tool's output) is rendered as harmony frames it, its text
tokenized by tiktoken (text_tokens.py: the same tokens, about three times as fast, and not
quadratic in a run without spaces as harmony's tokenizer is): harmony renders the item with an
empty text once per header (role, channel, recipient, ...), and the text's tokens go between that
frame's `<|message|>` and its end token. The system and developer messages are harmony's render,
except where their texts (instructions, tools' descriptions and parameter schemas, the response
format) hold a long run without spaces (`Renderer._head`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from openai_harmony import HarmonyEncoding

from server.contracts import transcript as transcript_types
from server.harmony.render import (
    assistant_start_tokens,
    exact_tokens,
    head_key,
    head_tokens,
    item_tokens,
    tool_message_tokens,
    visible_items,
)
from server.harmony.text_tokens import TextTokens, shared_text_tokens
from server.harmony.tokens import MESSAGE, MESSAGE_TERMINATORS

# Tokens remembered (items keep their text too: some tens of MB in all)
HEADS_KEPT = 1 << 20  # of system + developer renders
ITEMS_KEPT = 1 << 21  # of item renders
FRAMES_KEPT = 4096  # items' frames (one per header: role, channel, recipient, tool name)

_UNKNOWN = object()
_LONG_RUN = re.compile(r"\S{256,}")  # a run without spaces this long goes to tiktoken in a head
_MARK = "\ue000"  # a private-use character around a placeholder's number
_ESCAPED_MARK = "\\ue000"  # the mark as json.dumps writes it (a response format's schema)
# a tool schema's texts harmony renders (as comments, or quoted as given): runs in them are
# placeholders; other keys' strings (names, types, patterns) are left as they are
_SCHEMA_TEXTS = frozenset({"description", "title", "enum", "default", "examples", "const"})
_SCHEMA_DEPTH = 64  # levels of a schema searched for runs (deeper ones: a request's own error)

# the field that holds an item's text, between its frame's `<|message|>` and end token
TEXT_FIELD: dict[type, str] = {
    transcript_types.UserMessage: "text",
    transcript_types.DeveloperMessage: "text",
    transcript_types.Reasoning: "text",
    transcript_types.AssistantMessage: "text",
    transcript_types.ToolCall: "arguments",
    transcript_types.ToolResult: "output",
}


class Renders:
    """Least recently used renders, up to a number of tokens in all; any thread may use it."""

    def __init__(self, max_tokens: int) -> None:
        self._max_tokens = max_tokens
        self._n_tokens = 0
        self._tokens: OrderedDict[Hashable, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], list[int]]) -> tuple[int, ...]:
        with self._lock:
            tokens = self._tokens.get(key)
            if tokens is not None:
                self._tokens.move_to_end(key)
                return tokens
        tokens = tuple(make())
        with self._lock:
            if key not in self._tokens and len(tokens) <= self._max_tokens:
                self._tokens[key] = tokens
                self._n_tokens += len(tokens)
            while self._n_tokens > self._max_tokens:
                self._n_tokens -= len(self._tokens.popitem(last=False)[1])
        return tokens


class Renderer:
    """Prompts of one encoding, rendered with what earlier requests rendered."""

    def __init__(self, encoding: HarmonyEncoding, text_tokens: TextTokens | None = None) -> None:
        """`text_tokens`: tiktoken's tokens of a text (by default this process's, for the
        vocabulary harmony was loaded from; without it every item is rendered by harmony)."""
        self.encoding = encoding
        self.assistant_start = tuple(assistant_start_tokens(encoding))  # encoding it: ≈ 0.1 ms
        self._heads = Renders(HEADS_KEPT)
        self._items = Renders(ITEMS_KEPT)
        self._text = text_tokens or shared_text_tokens(encoding)
        self._frames: dict[transcript_types.Item, tuple[tuple[int, ...], int] | None] = {}

    def render(self, transcript: transcript_types.Transcript) -> list[int]:
        """The prompt token ids for the assistant's next message, as render() gives them."""
        key = head_key(transcript)
        prompt_tokens = list(self._heads.get(key, lambda: self._head(transcript, key)))
        for item in visible_items(transcript.items):
            replayed = exact_tokens(item)
            if replayed is None:
                replayed = self._items.get(item, lambda: self._item_tokens(item))  # noqa: B023
            prompt_tokens.extend(replayed)
        prompt_tokens.extend(self.assistant_start)
        return prompt_tokens

    def _head(self, transcript: transcript_types.Transcript, key: Hashable) -> list[int]:
        """The system and developer messages as head_tokens() renders them. A long run without
        spaces (harmony's tokenizer is quadratic in one) in the instructions, a tool's or its
        namespace's description, the texts of a tool's parameter schema (descriptions, titles,
        enum values, defaults, examples) or the response format (its description, its schema's
        strings) is rendered by harmony as a short placeholder, and the message's text, the run
        put back, is tokenized by tiktoken: harmony tokenizes a message's text as one piece.

        A placeholder harmony does not render (a schema text it leaves out) is put back into
        the transcript and harmony renders the head again: a run that does not show costs
        nothing, and one that shows otherwise than as written is harmony's to tokenize.
        `key`: the head's `head_key`."""
        if self._text is None or _marked(key):
            return head_tokens(self.encoding, transcript)
        kept: set[int] = set()  # runs given to harmony as they are (their placeholder did not show)
        while True:
            shrink = _Shrink(kept)
            small = shrink.transcript(transcript)
            if not shrink.runs or len(kept) == len(shrink.runs):
                return head_tokens(self.encoding, transcript)
            spliced, missing = self._put_back(head_tokens(self.encoding, small), shrink.runs)
            if spliced is None:
                return head_tokens(self.encoding, transcript)
            if not missing - kept:
                return spliced
            kept |= missing

    def _put_back(self, tokens: list[int], runs: list[str]) -> tuple[list[int] | None, set[int]]:
        """`tokens` with each message's text re-tokenized, its placeholders replaced by `runs`
        (as written, or JSON-escaped where the text holds them so: a response format's schema),
        and the runs whose placeholder is nowhere; None where a placeholder is left in a form
        not written here."""
        out: list[int] = []
        found = [0] * len(runs)
        at = 0
        for start, end in _bodies(tokens):
            if end == len(tokens):  # a message without its end token
                return None, set()
            text = self.encoding.decode_utf8(tokens[start:end])
            if _MARK in text or _ESCAPED_MARK in text:
                for index, run in enumerate(runs):
                    for mark, written in (
                        (_placeholder(index), run),
                        (_ESCAPED_MARK + str(index) + _ESCAPED_MARK, json.dumps(run)[1:-1]),
                    ):
                        found[index] += text.count(mark)
                        text = text.replace(mark, written)
                if _MARK in text or _ESCAPED_MARK in text:
                    return None, set()
            body = self._text.encode(text) if self._text is not None else None
            if body is None:
                return None, set()
            out.extend(tokens[at:start])
            out.extend(body)
            at = end
        out.extend(tokens[at:])
        return out, {index for index, count in enumerate(found) if not count}

    def tool_result_tokens(self, author: str, text: str, channel: str) -> list[int]:
        """A server-run tool's result message, as tool_message_tokens() renders it."""
        namespace, _, name = author.partition(".")
        item = transcript_types.ToolResult("", text, name or namespace, namespace, channel)
        if item.author != author:  # a name this split does not give back: harmony renders it
            return tool_message_tokens(self.encoding, author, text, channel)
        return self._item_tokens(item)

    def _item_tokens(self, item: transcript_types.Item) -> list[int]:
        """An item's render: its frame around tiktoken's tokens of its text, or harmony's."""
        field = TEXT_FIELD.get(type(item))
        body = self._text.encode(getattr(item, field)) if self._text and field else None
        frame = self._frame(item, field) if body is not None and field else None
        if body is None or frame is None:
            return item_tokens(self.encoding, item)
        head, end = frame
        return [*head, *body, end]

    def _frame(self, item: transcript_types.Item, field: str) -> tuple[tuple[int, ...], int] | None:
        """harmony's render of the item with an empty text, up to `<|message|>` and its end
        token; None where it does not end so (then harmony renders the whole item). The call
        id is not rendered: items that differ only by it and their text share a frame."""
        empty = {field: "", "call_id": ""} if hasattr(item, "call_id") else {field: ""}
        key = dataclasses.replace(item, **empty)  # type: ignore[arg-type]
        known = self._frames.get(key, _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        tokens = item_tokens(self.encoding, key)
        framed = tokens[-2:-1] == [MESSAGE] and tokens[-1] in MESSAGE_TERMINATORS
        frame = (tuple(tokens[:-1]), tokens[-1]) if framed else None
        if len(self._frames) >= FRAMES_KEPT:
            self._frames.clear()
        self._frames[key] = frame
        return frame


def _bodies(tokens: list[int]) -> Iterator[tuple[int, int]]:
    """Where each message's text is: after its `<|message|>`, up to its end token (or the end
    of `tokens` where it has none)."""
    start = 0
    while True:
        try:
            start = tokens.index(MESSAGE, start) + 1
        except ValueError:
            return
        end = start
        while end < len(tokens) and tokens[end] not in MESSAGE_TERMINATORS:
            end += 1
        yield start, end
        start = end


def _placeholder(index: int) -> str:
    return f"{_MARK}{index}{_MARK}"


def _marked(key: Hashable) -> bool:
    """Whether the head's texts (its `head_key`) hold the placeholders' mark already, as the
    character or as its JSON escape (then no placeholder is used: one could be taken for
    another). repr writes the character as that escape and doubles a backslash, so either spells
    the escape there."""
    return _ESCAPED_MARK in repr(key)


class _Shrink:
    """A transcript's head with its long runs as placeholders, numbered in the order they are
    met (the same order at every call); the runs numbered in `kept` stay as they are."""

    def __init__(self, kept: set[int]) -> None:
        self.kept = kept
        self.runs: list[str] = []

    def transcript(self, transcript: transcript_types.Transcript) -> transcript_types.Transcript:
        response_format = transcript.response_format
        if response_format is not None:
            response_format = dataclasses.replace(
                response_format,
                description=self.text(response_format.description),
                schema=self.json(response_format.schema),
            )
        return dataclasses.replace(
            transcript,
            instructions=self.text(transcript.instructions) if transcript.instructions else None,
            tools=tuple(
                dataclasses.replace(
                    spec,
                    description=self.text(spec.description),
                    namespace_description=self.text(spec.namespace_description),
                    parameters=self.schema(spec.parameters),
                )
                for spec in transcript.tools
            ),
            response_format=response_format,
        )

    def text(self, text: str) -> str:
        def placeholder(run: re.Match[str]) -> str:
            self.runs.append(run.group())
            index = len(self.runs) - 1
            return run.group() if index in self.kept else _placeholder(index)

        return _LONG_RUN.sub(placeholder, text)

    def schema(self, schema: Any, depth: int = 0) -> Any:
        """A tool's parameter schema with the runs of the texts harmony renders (by their key:
        `_SCHEMA_TEXTS`) as placeholders; names, types and the rest as they are. Below
        `_SCHEMA_DEPTH` levels the schema stays as it is (harmony's to tokenize)."""
        if depth > _SCHEMA_DEPTH:
            return schema
        if isinstance(schema, list):
            return [self.schema(value, depth + 1) for value in schema]
        if not isinstance(schema, dict):
            return schema
        shrunk: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _SCHEMA_TEXTS and isinstance(value, (str, list)):
                shrunk[key] = self._texts(value)
            else:
                shrunk[key] = self.schema(value, depth + 1)
        return shrunk

    def _texts(self, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, str):
            return self.text(value)
        return [self.text(item) if isinstance(item, str) else item for item in value]

    def json(self, value: Any, depth: int = 0) -> Any:
        """A JSON value with every string's runs as placeholders (keys as they are), down to
        `_SCHEMA_DEPTH` levels."""
        if isinstance(value, str):
            return self.text(value)
        if depth > _SCHEMA_DEPTH:
            return value
        if isinstance(value, list):
            return [self.json(item, depth + 1) for item in value]
        if isinstance(value, dict):
            return {key: self.json(item, depth + 1) for key, item in value.items()}
        return value
