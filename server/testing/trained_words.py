"""The trained tiny model's word pool: single-token words, split into training and held-out.

The corpus (scripts/train_tiny/corpus.py) draws its values from the training part; the held-out
part (a tenth, chosen by hash) never appears in it, so a held-out word the model writes back was
copied, not recalled. Tests draw their values from `typed_words` of the held-out part.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from openai_harmony import HarmonyEncoding

from server.harmony.tokens import FIRST_SPECIAL


def word_pool(enc: HarmonyEncoding) -> tuple[list[str], list[str]]:
    """Single-token lowercase words (3-9 letters), split into (training, held-out) by hash."""
    train: list[str] = []
    held: list[str] = []
    for tid in range(FIRST_SPECIAL):
        try:
            text = enc.decode_utf8([tid])
        except Exception:  # ids that are not whole UTF-8 text
            continue
        if re.fullmatch(r"[a-z]{3,9}", text):
            digest = hashlib.sha256(text.encode()).digest()[0]
            (held if digest % 10 == 0 else train).append(text)
    return sorted(train), sorted(held)


def typed_words(enc: HarmonyEncoding, words: Iterable[str]) -> list[str]:
    """The words, not fragments (`umulative`): at least 4 letters, one token alone and one
    token after a space, as a user's message has them."""
    return [w for w in words if len(w) >= 4 and len(enc.encode(" " + w)) == 1]
