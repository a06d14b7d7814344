"""A forced script that counts the tokens the engine sampled: how far a generation went."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript


class CountingScript(ForcedScript):
    """A forced script that also counts the tokens the engine has sampled so far."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        super().__init__(encoding)
        self.sampled = 0

    def __call__(self, prompt_tokens: Sequence[int]) -> Callable[[int], int] | None:
        chooser = super().__call__(prompt_tokens)
        if chooser is None:
            return None

        def counting(sampled: int) -> int:
            self.sampled += 1
            return chooser(sampled)

        return counting
