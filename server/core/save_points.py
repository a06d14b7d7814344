"""Save points: the prompt lengths worth keeping on disk once evaluated (the engine's prompt
cache saves a sequence's KV state there).

- The end of the system + developer block: instructions and tools, shared by every
  conversation of a client.
- The start of the last user message's text: shared by a new conversation of the same client
  in the same environment, and by an edited last message.

Pure: token ids in, positions out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from openai_harmony import HarmonyEncoding

from server.harmony.tokens import END


@dataclass(frozen=True, slots=True)
class SavePoints:
    """Where to save a prompt; built once per encoding."""

    developer_start: tuple[int, ...]  # <|start|>developer
    user_start: tuple[int, ...]  # <|start|>user<|message|>

    @classmethod
    def of(cls, encoding: HarmonyEncoding) -> SavePoints:
        def tokens(text: str) -> tuple[int, ...]:
            return tuple(encoding.encode(text, allowed_special="all"))

        return cls(tokens("<|start|>developer"), tokens("<|start|>user<|message|>"))

    def __call__(self, prompt_tokens: Sequence[int]) -> tuple[int, ...]:
        """The save points of `prompt_tokens`, in order."""
        prompt = list(prompt_tokens)
        points = set()
        first_end = _find(prompt, END)
        if first_end >= 0:
            head = first_end + 1
            after = tuple(prompt[head : head + len(self.developer_start)])
            second_end = _find(prompt, END, head)
            developer = after == self.developer_start and second_end >= 0
            points.add(second_end + 1 if developer else head)
        user = self.user_start
        last_user = -1
        at = _find(prompt, user[0])
        while at >= 0:  # messages start there: a few per prompt (list.index scans in C)
            if tuple(prompt[at : at + len(user)]) == user:
                last_user = at
            at = _find(prompt, user[0], at + 1)
        if last_user >= 0:
            points.add(last_user + len(user))
        return tuple(sorted(points))


def _find(tokens: list[int], token: int, start: int = 0) -> int:
    """The first position of `token` at or after `start`, or -1."""
    try:
        return tokens.index(token, start)
    except ValueError:
        return -1
