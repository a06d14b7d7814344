"""Forced-token scripts: choose what the real engine samples, nothing else is faked.

A script is harmony text (`<|channel|>final<|message|>Hi<|return|>`) encoded to token ids. The
engine calls the hook at the start of each generation; the hook hands out the next queued script,
whose tokens replace the sampled ones one by one. When a script runs out, sampling is left alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from openai_harmony import HarmonyEncoding


class ForcedScript:
    """A sampling hook with a queue of scripts, one per generation."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self.encoding = encoding
        self._queue: deque[list[int]] = deque()
        self._lock = threading.Lock()
        self.prompts: list[list[int]] = []  # the prompt of every generation, in order

    def push(self, harmony_text: str) -> list[int]:
        """Queue the tokens of `harmony_text` for the next generation; returns them."""
        tokens = self._encoding.encode(harmony_text, allowed_special="all")
        self.push_tokens(tokens)
        return tokens

    def push_tokens(self, tokens: Sequence[int]) -> None:
        with self._lock:
            self._queue.append(list(tokens))

    @contextmanager
    def held(self) -> Iterator[None]:
        """Generations wait at their start (the hook, on the engine thread) until the block
        ends: a test's requests stay running while it acts. Push scripts before, not inside."""
        with self._lock:
            yield

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def __call__(self, prompt_tokens: Sequence[int]) -> Callable[[int], int] | None:
        with self._lock:
            self.prompts.append(list(prompt_tokens))
            if not self._queue:
                return None
            script = iter(self._queue.popleft())
        return lambda sampled: next(script, sampled)
