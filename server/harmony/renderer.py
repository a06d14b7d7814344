"""Renderer: render() with a memory across requests, owned by the Generator (app state).

A client sends the same system and developer messages on every turn (Codex's instructions and
tools take ≈ 6 ms to render: most of a request's preparation), and every earlier message of the
conversation again. Their renders are remembered, least recently used dropped beyond a number of
tokens, so a turn renders only what is new. Same transcript, same tokens as render().
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from openai_harmony import HarmonyEncoding

from server.contracts.transcript import Transcript
from server.harmony.render import (
    assistant_start_tokens,
    exact_tokens,
    head_key,
    head_tokens,
    item_tokens,
    visible_items,
)

# Tokens remembered (items keep their text too: some tens of MB in all)
HEADS_KEPT = 1 << 20  # of system + developer renders
ITEMS_KEPT = 1 << 21  # of item renders


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

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding
        self.assistant_start = tuple(assistant_start_tokens(encoding))  # encoding it: ≈ 0.1 ms
        self._heads = Renders(HEADS_KEPT)
        self._items = Renders(ITEMS_KEPT)

    def render(self, transcript: Transcript) -> list[int]:
        """The prompt token ids for the assistant's next message, as render() gives them."""
        encoding = self.encoding
        prompt_tokens = list(
            self._heads.get(head_key(transcript), lambda: head_tokens(encoding, transcript))
        )
        for item in visible_items(transcript.items):
            replayed = exact_tokens(item)
            if replayed is None:
                replayed = self._items.get(item, lambda: item_tokens(encoding, item))  # noqa: B023
            prompt_tokens.extend(replayed)
        prompt_tokens.extend(self.assistant_start)
        return prompt_tokens
