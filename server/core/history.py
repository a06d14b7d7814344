"""History: what this server generated, so that replayed conversations render as sampled.

Clients send earlier assistant output back as text (and often drop the reasoning). Rendering that
text again can give other tokens than the model sampled (`to=` placement, `<|constrain|>`, BPE
splits), which breaks the KV-cache prefix. This bounded, least-recently-used record keeps the
exact tokens of every complete message the server generated, keyed by what comes back:

- tool calls by call id, with the analysis the model wrote before the call;
- reasoning, preambles and final answers by their text (and the reasoning of one completion
  joined with newlines, as Chat Completions returns it);
- reasoning also by the text of its summary: where a client was shown only the summary (the
  `summary` visibility policy) and sends that back as reasoning, the raw analysis is replayed.

`apply()` gives matching transcript items their exact tokens and restores the analysis in front
of a tool call whose reasoning the client omitted.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from server.contracts.events import SegmentEnd, SegmentKind
from server.contracts.transcript import AssistantMessage, Item, Reasoning, ToolCall, Transcript
from server.harmony.tokens import END, RETURN, START


@dataclass(frozen=True, slots=True)
class _Message:
    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Call:
    arguments: str
    tokens: tuple[int, ...]
    reasoning: tuple[_Message, ...]


_TEXT_KINDS = {
    SegmentKind.REASONING: "reasoning",
    SegmentKind.PREAMBLE: "commentary",
    SegmentKind.FINAL: "final",
}


K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A dict that forgets its least recently used entries beyond `max_entries`."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._max_entries:
            self._data.popitem(last=False)

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value


class History:
    """Bounded record of generated messages; lives on the app, used on the event loop."""

    def __init__(self, message_start: Sequence[int], max_entries: int = 4096) -> None:
        self._message_start = tuple(message_start)  # <|start|>assistant
        self._texts: _LRU[tuple[str, str], tuple[int, ...]] = _LRU(max_entries)
        self._calls: _LRU[str, _Call] = _LRU(max_entries)

    def __len__(self) -> int:
        return len(self._texts) + len(self._calls)

    def record(self, segments: Sequence[SegmentEnd]) -> None:
        """Remember the complete messages of one completion, in the order they were sampled."""
        since_last_call: list[_Message] = []
        all_reasoning: list[_Message] = []
        for segment in segments:
            if not segment.complete:
                continue
            message = _Message(segment.text, self._normalized(segment.tokens))
            if segment.kind is SegmentKind.TOOL_CALL:
                if segment.call_id:
                    call = _Call(message.text, message.tokens, tuple(since_last_call))
                    self._calls.put(segment.call_id, call)
                since_last_call = []
                continue
            self._texts.put((_TEXT_KINDS[segment.kind], message.text), message.tokens)
            if segment.kind is SegmentKind.REASONING:
                since_last_call.append(message)
                all_reasoning.append(message)
        if len(all_reasoning) > 1:  # Chat Completions returns them as one text
            joined = "\n".join(m.text for m in all_reasoning)
            self._texts.put(
                ("reasoning", joined), tuple(t for m in all_reasoning for t in m.tokens)
            )

    def record_summaries(self, summarized: Sequence[tuple[SegmentEnd, str]]) -> None:
        """Key complete reasoning messages also by their summary (and all joined, as above)."""
        entries = [
            (summary, self._normalized(segment.tokens))
            for segment, summary in summarized
            if segment.complete and segment.kind is SegmentKind.REASONING and summary
        ]
        for summary, tokens in entries:
            self._texts.put(("reasoning", summary), tokens)
        if len(entries) > 1:
            joined = "\n".join(summary for summary, _ in entries)
            self._texts.put(("reasoning", joined), tuple(t for _, ts in entries for t in ts))

    def apply(self, transcript: Transcript) -> Transcript:
        """The transcript with exact tokens attached and omitted tool-call reasoning restored."""
        items: list[Item] = []
        for item in transcript.items:
            if isinstance(item, ToolCall):
                items.extend(self._tool_call(item, after_reasoning=_ends_with_reasoning(items)))
            else:
                items.append(self._with_tokens(item))
        return dataclasses.replace(transcript, items=tuple(items))

    def _with_tokens(self, item: Item) -> Item:
        if isinstance(item, Reasoning) and item.tokens is None:
            tokens = self._texts.get(("reasoning", item.text))
            return dataclasses.replace(item, tokens=tokens) if tokens else item
        if isinstance(item, AssistantMessage) and item.tokens is None:
            tokens = self._texts.get((item.channel, item.text))
            return dataclasses.replace(item, tokens=tokens) if tokens else item
        return item

    def _tool_call(self, call: ToolCall, *, after_reasoning: bool) -> list[Item]:
        record = self._calls.get(call.call_id)
        if record is None or not _same_arguments(record.arguments, call.arguments):
            return [call]
        restored: list[Item] = []
        if not after_reasoning:
            restored = [Reasoning(m.text, tokens=m.tokens) for m in record.reasoning]
        return [*restored, dataclasses.replace(call, tokens=call.tokens or record.tokens)]

    def _normalized(self, tokens: Sequence[int]) -> tuple[int, ...]:
        return prompt_tokens(tokens, self._message_start)


def prompt_tokens(tokens: Sequence[int], message_start: Sequence[int]) -> tuple[int, ...]:
    """A sampled message as it appears in a later prompt.

    The first message of a completion lacks `message_start` (`<|start|>assistant`: the prompt
    ended with it), and a final answer's `<|return|>` becomes `<|end|>`.
    """
    body = list(tokens)
    if body and body[-1] == RETURN:
        body[-1] = END
    if not body or body[0] != START:
        body = [*message_start, *body]
    return tuple(body)


def _ends_with_reasoning(items: Sequence[Item]) -> bool:
    """Whether the assistant turn being built already carries reasoning before this call."""
    for item in reversed(items):
        if isinstance(item, Reasoning):
            return True
        if not isinstance(item, (AssistantMessage, ToolCall)):
            return False
    return False


def _same_arguments(recorded: str, sent: str) -> bool:
    if recorded == sent:
        return True
    try:
        return bool(json.loads(recorded) == json.loads(sent))
    except ValueError:
        return False
