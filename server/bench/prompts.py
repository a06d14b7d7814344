"""Seeded random prompts of an exact token count.

Token-id prompts (the engine in-process, llama-server) are random ordinary tokens, as
llama-bench uses. Chat prompts (this server over HTTP) are random words that are one token
each, so the text of n words renders to exactly n tokens. Each step's prompt starts with a
token (word) of its own, so no request reuses another's KV cache beyond the chat headers.
"""

from __future__ import annotations

import random
import re

from openai_harmony import HarmonyEncoding

from server.bench.plan import BenchError
from server.harmony.tokens import FIRST_SPECIAL

ORDINARY_TOKENS = FIRST_SPECIAL  # o200k_base ranks; harmony's special tokens come after them
NONCE_TOKENS_START = 100  # step i's prompt starts with token 100 + i; the rest are drawn above
_WORD = re.compile(r" [a-z]{3,10}")


def step_rng(seed: int, index: int) -> random.Random:
    return random.Random(seed * 1_000_003 + index)


def random_tokens(seed: int, index: int, n: int) -> list[int]:
    """n random ordinary token ids, the first one unique to the step (no shared prefix)."""
    rng = step_rng(seed, index)
    tokens = [rng.randrange(1000, ORDINARY_TOKENS) for _ in range(n)]
    tokens[0] = NONCE_TOKENS_START + index
    return tokens


class WordPrompts:
    """Texts of n single-token words (leading space each), n tokens exactly."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self.words = single_token_words(encoding)
        if len(self.words) < 100:
            raise BenchError("the vocabulary has too few single-token words")

    def text(self, seed: int, index: int, n_words: int) -> str:
        rng = step_rng(seed, index)
        words = [rng.choice(self.words) for _ in range(n_words)]
        words[0] = self.words[index % len(self.words)]  # unique to the step: no shared prefix
        text = "".join(words)
        n_tokens = len(self._encoding.encode(text))
        if n_tokens != n_words:
            raise BenchError(f"{n_words} words encoded to {n_tokens} tokens")
        return text


def single_token_words(encoding: HarmonyEncoding) -> list[str]:
    """Ordinary tokens whose text is ' ' + 3-10 lowercase letters.

    Such a text is one pre-token of o200k's split pattern and in the vocabulary, so BPE maps it
    to that one token (`WordPrompts.text` checks the count of every prompt).
    """
    texts = (encoding.decode([token]) for token in range(ORDINARY_TOKENS))
    return [text for text in texts if _WORD.fullmatch(text)]
