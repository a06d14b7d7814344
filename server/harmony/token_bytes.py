"""TokenBytes: the exact bytes of each o200k_harmony token (what logprobs report per token).

A token may hold part of a UTF-8 character, so its text alone is lossy; the bytes come from the
local o200k_base vocabulary file that the encoding was loaded from (server/harmony/encoding.py
points $TIKTOKEN_ENCODINGS_BASE at it), the specials from their names.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from openai_harmony import HarmonyEncoding

from server.harmony.encoding import ENV_VAR, VOCAB_FILE
from server.harmony.tokens import FIRST_SPECIAL


class TokenBytes:
    """Token id -> bytes, and -> its text (partial UTF-8 shown as U+FFFD)."""

    def __init__(self, encoding: HarmonyEncoding, ranks: list[bytes]) -> None:
        self._encoding = encoding
        self._ranks = ranks

    @classmethod
    def load(cls, encoding: HarmonyEncoding) -> TokenBytes:
        """From the vocabulary file the encoding was loaded from (empty if it is not found:
        tokens then fall back to their decoded text)."""
        directory = os.environ.get(ENV_VAR)
        path = Path(directory) / VOCAB_FILE if directory else None
        ranks: list[bytes] = []
        if path is not None and path.is_file():
            for line in path.read_bytes().splitlines():
                token, _, _rank = line.partition(b" ")
                ranks.append(base64.b64decode(token))
        return cls(encoding, ranks)

    def of(self, token: int) -> bytes:
        if 0 <= token < min(FIRST_SPECIAL, len(self._ranks)):
            return self._ranks[token]
        return self._encoding.decode([token]).encode()

    def text(self, token: int) -> str:
        return self.of(token).decode("utf-8", errors="replace")
