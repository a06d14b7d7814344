"""The trained tiny model's word pool: single-token words, split into training and held-out.

The corpus (devkit/train_tiny/corpus.py) draws its values from the training part; the held-out
part (a tenth, chosen by hash) never appears in it, so a held-out word the model writes back was
copied, not recalled. Tests draw their values from `typed_words` of the held-out part.
`split_prefixes` is how the corpus writes the model's own text in tokens.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from openai_harmony import HarmonyEncoding

from server.harmony.tokens import FIRST_SPECIAL, MESSAGE, MESSAGE_TERMINATORS


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


def split_prefixes(
    enc: HarmonyEncoding, tokens: list[int], prefixes: str = "-", shortest: int = 2
) -> list[int]:
    """The model's own message text with `-word` written as two tokens, `-` then the bare word,
    wherever that word is one token (the text is the same; the server feeds back whatever
    tokens the model wrote). A patch's removed line (`-color`, one token as the tokenizer
    writes it) then starts with a `-` the place predicts, then copies its first word as it
    stands in the user's message (`` `color``), instead of a merged token whose prefix the
    copy would have to carry; an added line already comes as `+`, `color`. `prefixes`: the
    characters split off this way (`.-`: also a path's `.tom` of `settings.toml`); `shortest`:
    the fewest letters of a word split off (3: a word that has a word row of its own, so `.py`
    stays one token, copied as it stands in the user's message)."""
    split = re.compile(f"([{re.escape(prefixes)}])([a-z]{{{shortest},12}})")
    out: list[int] = []
    content = False
    for t in tokens:
        if t == MESSAGE:
            content = True
        elif t in MESSAGE_TERMINATORS:
            content = False
        elif content and t < FIRST_SPECIAL:
            match = split.fullmatch(text_of(enc, t))
            if match:
                bare = enc.encode(match.group(2))
                if len(bare) == 1:
                    out.extend([*enc.encode(match.group(1)), bare[0]])
                    continue
        out.append(t)
    return out


def text_of(enc: HarmonyEncoding, t: int) -> str:
    """A token's text, or "" for one that is part of a UTF-8 sequence."""
    try:
        return enc.decode_utf8([t])
    except Exception:
        return ""
