"""TextTokens: a message's text as harmony renders it, by tiktoken.

harmony renders a message as its header tokens, `<|message|>`, the text's ordinary o200k tokens
(text that spells a special token stays text) and its end token. openai-harmony tokenizes the
text with its own port of tiktoken's BPE, holding the GIL; tiktoken itself (OpenAI's library,
the same ranks and pattern) does it about three times as fast and lets go of the GIL meanwhile;
an agent's every turn renders its new tool outputs before the prompt reaches the engine. And
harmony's time grows with the square of a run without spaces (minified code, base64, a long
hash), with the GIL held: 160,000 letters stand the whole server still for ≈ 9 s (the
measurements: devkit/notes/benchmarks-history.md).

The encoder is built from the verified o200k file harmony was pointed at (encoding.py), in a
background thread (≈ 0.3 s; ≈ 117 MB of memory: tiktoken's tables and the ranks it keeps),
once per process; a text that comes meanwhile waits for it. Where it cannot be built, `encode`
answers None and the caller renders with harmony. The tokens are the same either way
(tests/unit/harmony/test_text_tokens.py compares them on generated text).
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import tiktoken
from openai_harmony import HarmonyEncoding

from server.harmony.encoding import ENV_VAR, VOCAB_FILE

log = logging.getLogger(__name__)

# o200k's pre-tokenization pattern, as tiktoken's o200k_base defines it (checked equal to
# tiktoken_ext.openai_public's by the tests)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# checked against harmony's own encoding once built: words, digits, a special token's text
PROBE = "Hello, wörld! 12345 <|end|> \t\n  x's 日本語 🙂"

LOAD_WAIT_S = 30.0  # the most a text waits for the encoder's build (≈ 0.3 s)

Reference = Callable[[str], list[int]]


class TextTokens:
    """The ordinary o200k tokens of a text (None where the encoder could not be built)."""

    def __init__(self, vocab_file: Path, reference: Reference) -> None:
        self._encoder: tiktoken.Encoding | None = None
        self._loaded = threading.Event()
        self._thread = threading.Thread(
            target=self._load, args=(vocab_file, reference), name="text-tokens", daemon=True
        )
        self._thread.start()

    def encode(self, text: str) -> list[int] | None:
        """The text's tokens; None only where the encoder could not be built (the caller then
        renders with harmony). A call during the build waits for it: harmony's tokenizer is
        not a fallback to prefer, being quadratic in a long run without spaces."""
        if not self._loaded.is_set():
            self._loaded.wait(LOAD_WAIT_S)
        encoder = self._encoder
        return encoder.encode_ordinary(text) if encoder is not None else None

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the encoder is ready, after waiting for its build at most `timeout` s."""
        self._loaded.wait(timeout)
        return self._encoder is not None

    def _load(self, vocab_file: Path, reference: Reference) -> None:
        try:
            encoder = build_encoder(vocab_file)
            if encoder.encode_ordinary(PROBE) != reference(PROBE):
                log.warning("tiktoken's o200k disagrees with harmony's; rendering with harmony")
                return
            self._encoder = encoder
        except (OSError, ValueError) as exc:
            log.warning("tiktoken's o200k could not be built (%s); rendering with harmony", exc)
        finally:
            self._loaded.set()


def build_encoder(vocab_file: Path) -> tiktoken.Encoding:
    """o200k's ordinary tokens (no special token) from a `.tiktoken` ranks file."""
    ranks = {}
    for line in vocab_file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        "o200k_base", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )


def shared_text_tokens(encoding: HarmonyEncoding) -> TextTokens | None:
    """This process's TextTokens for the vocabulary harmony was pointed at, checked against
    `encoding` (None when harmony was not loaded from a local file)."""
    directory = os.environ.get(ENV_VAR)
    if not directory or not (Path(directory) / VOCAB_FILE).is_file():
        return None
    vocab_file = Path(directory) / VOCAB_FILE
    with _LOCK:
        shared = _SHARED.get(vocab_file)
        if shared is None:

            def reference(text: str) -> list[int]:
                return encoding.encode(text, disallowed_special=())

            shared = _SHARED[vocab_file] = TextTokens(vocab_file, reference)
    return shared


_SHARED: dict[Path, TextTokens] = {}
_LOCK = threading.Lock()


def encode_text(encoding: HarmonyEncoding, text: str, allow_special: bool) -> list[int]:
    """`encoding.encode(text, allowed_special="all" if allow_special else set())`, its ordinary
    text tokenized by tiktoken: the text between special tokens' names is tokenized piece by
    piece, as harmony does. Special-token text that is not allowed goes to harmony, which
    raises on it (HarmonyError) before tokenizing anything."""
    pattern = _special_pattern(encoding)
    text_tokens = shared_text_tokens(encoding)
    if (
        text_tokens is None
        or not text_tokens.wait(LOAD_WAIT_S)  # (encode answers None then)
        or (not allow_special and pattern.search(text) is not None)
    ):
        return encoding.encode(text, allowed_special="all" if allow_special else set())
    tokens: list[int] = []
    at = 0
    for special in pattern.finditer(text):  # none where they are not allowed (checked above)
        tokens.extend(text_tokens.encode(text[at : special.start()]) or ())
        tokens.extend(_special_token(encoding, special.group()))
        at = special.end()
    tokens.extend(text_tokens.encode(text[at:]) or ())
    return tokens


@functools.cache
def _special_pattern(encoding: HarmonyEncoding) -> re.Pattern[str]:
    """Any of the encoding's special tokens' names, the longest first."""
    names = sorted(encoding.special_tokens_set, key=len, reverse=True)
    return re.compile("|".join(re.escape(name) for name in names))


@functools.cache
def _special_token(encoding: HarmonyEncoding, name: str) -> tuple[int, ...]:
    """A special token's name encoded, once (each call of harmony's encode with specials
    allowed escapes all of their names: 0.16 ms)."""
    return tuple(encoding.encode(name, allowed_special="all"))
