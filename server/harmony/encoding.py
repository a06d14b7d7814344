"""Load the harmony gpt-oss encoding without network access.

openai-harmony reads `o200k_base.tiktoken` from $TIKTOKEN_ENCODINGS_BASE (verifying its sha256)
and otherwise downloads it. This module finds a local source, writes a hash-checked copy into the
cache directory and points harmony at it. Sources, in order: an existing
$TIKTOKEN_ENCODINGS_BASE, the cache, the `bpe-openai` package, then the ranks of a GGUF
vocabulary supplied by the caller.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

from server.contracts.errors import VocabularyNotFound
from server.harmony.tokens import FIRST_SPECIAL

log = logging.getLogger(__name__)

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
N_RANKS = FIRST_SPECIAL  # o200k_base ranks; the harmony specials follow them
ENV_VAR = "TIKTOKEN_ENCODINGS_BASE"

RankSource = Callable[[], Sequence[bytes]]


def load_encoding(cache_dir: Path, ranks_source: RankSource | None = None) -> HarmonyEncoding:
    """The harmony gpt-oss encoding, from a local copy of the o200k vocabulary."""
    vocab_dir = ensure_vocab_dir(cache_dir, ranks_source)
    os.environ[ENV_VAR] = str(vocab_dir)
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def ensure_vocab_dir(cache_dir: Path, ranks_source: RankSource | None = None) -> Path:
    """A directory holding a hash-verified `o200k_base.tiktoken`; raises VocabularyNotFound."""
    configured = os.environ.get(ENV_VAR)
    if configured and _is_valid(Path(configured) / VOCAB_FILE):
        return Path(configured)
    target = cache_dir / VOCAB_FILE
    if _is_valid(target):
        return cache_dir
    for name, produce in _producers(ranks_source):
        data = produce()
        if data is None:
            continue
        if _sha256(data) != VOCAB_SHA256:
            log.warning("vocabulary from %s does not match the expected sha256; skipped", name)
            continue
        _write_atomic(target, data)
        log.info("o200k vocabulary written to %s (source: %s)", target, name)
        return cache_dir
    raise VocabularyNotFound(
        "openai-harmony needs the o200k_base vocabulary and no local copy was found. "
        f"Install the `bpe-openai` package (pip install bpe-openai), or put a copy of {VOCAB_FILE} "
        f"(sha256 {VOCAB_SHA256}) in {cache_dir} or in a directory named by ${ENV_VAR}."
    )


def tiktoken_bytes(ranks: Sequence[bytes]) -> bytes:
    """The tiktoken file for the given token byte strings (rank = position)."""
    lines = (b"%s %d" % (base64.b64encode(token), rank) for rank, token in enumerate(ranks))
    return b"\n".join(lines) + b"\n"


def _producers(ranks_source: RankSource | None) -> list[tuple[str, Callable[[], bytes | None]]]:
    producers: list[tuple[str, Callable[[], bytes | None]]] = [("bpe-openai", _from_bpe_openai)]
    if ranks_source is not None:
        producers.append(("the model's GGUF vocabulary", lambda: _from_ranks(ranks_source)))
    return producers


def _from_bpe_openai() -> bytes | None:
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or spec.origin is None:
        return None
    packed = Path(spec.origin).parent / "data" / f"{VOCAB_FILE}.gz"
    if not packed.is_file():
        return None
    return gzip.decompress(packed.read_bytes())


def _from_ranks(ranks_source: RankSource) -> bytes | None:
    try:
        ranks = ranks_source()
    except (OSError, ValueError) as exc:
        log.warning("could not read the vocabulary from the model file: %s", exc)
        return None
    return tiktoken_bytes(ranks[:N_RANKS]) if len(ranks) >= N_RANKS else None


def _is_valid(path: Path) -> bool:
    return path.is_file() and _sha256(path.read_bytes()) == VOCAB_SHA256


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(data)
    Path(tmp.name).replace(target)
