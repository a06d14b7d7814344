"""Trained rows: the fixed embedding rows of the trained tiny gpt-oss (numpy only).

Every token the corpus does not train keeps a fixed random row drawn from a seed; the GGUF
assembly (devkit/trained/model.py) and the training model (devkit/train_tiny/model.py,
which runs without the server's dependencies) draw them here, identically.

Word-shaped tokens are structured, so that copying a word is one circuit even where the
tokenizer changes the token: `silver`, ` silver`, `_silver`, `/silver`, `.silver` and `-silver`
are six ids whose rows share the word's part (the first n_embd - PREFIX_DIMS components, drawn
per word) and differ in the prefix's part (the last PREFIX_DIMS, drawn per prefix). The user
writes ` silver`, the JSON argument needs `silver`: the model copies the word's part and writes
the prefix the place wants. With independent rows per id that mapping would have to be learned
word by word, which no amount of training teaches for words the corpus never contains.

Which prefixes share their word's row is a choice recorded with the parameters (`row_prefixes`):
the committed model's leaves `.` out, so a path's extension (`.toml`, `.json`) keeps a whole row
of its own, as the short ones (`.py`, `.rs`) always had: an extension is copied as it stands,
never written with another prefix, and with a shared row the `.` became a second decision that
the model got wrong about half the time (`settingstoml`; devkit/notes/trained-model-runs.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from server.contracts.vocabulary import N_VOCAB

PREFIXES = b" _/.-"  # a word's prefix class: 0 for none, 1 + its index here
PREFIX_DIMS = 16
WORD_TOKEN = re.compile(rb"([ _/.\-]?)([a-z]{3,9})")


def row_prefixes(saved: Mapping[str, Any]) -> bytes:
    """The prefixes whose words share their word's row, as saved parameters or a corpus record
    them (`row_prefixes`); all of PREFIXES where they were saved before the choice was."""
    return str(saved["row_prefixes"]).encode() if "row_prefixes" in saved else PREFIXES


def word_keys(
    tokens: Sequence[bytes], shared: bytes = PREFIXES
) -> tuple[NDArray[np.int32], NDArray[np.int8]]:
    """Per token id (the vocabulary's bytes in id order): the index of its word among the
    sorted distinct words (-1: not word-shaped) and its prefix class. Only a bare word and the
    words after a prefix in `shared` are word-shaped; the others keep whole rows (the words'
    indices, hence every shared row, are the same whatever `shared` leaves out)."""
    found: dict[int, tuple[bytes, int]] = {}
    for tid, text in enumerate(tokens):
        m = WORD_TOKEN.fullmatch(text)
        if m:
            found[tid] = (m.group(2), PREFIXES.find(m.group(1)) + 1 if m.group(1) else 0)
    index = {w: i for i, w in enumerate(sorted({w for w, _ in found.values()}))}
    word_of = np.full(N_VOCAB, -1, dtype=np.int32)
    prefix_of = np.zeros(N_VOCAB, dtype=np.int8)
    for tid, (w, p) in found.items():
        if p == 0 or PREFIXES[p - 1 : p] in shared:
            word_of[tid], prefix_of[tid] = index[w], p
    return word_of, prefix_of


def random_rows(
    seed: int, n_embd: int, keys: tuple[NDArray[np.int32], NDArray[np.int8]] | None
) -> NDArray[np.float16]:
    """The fixed row of every token (f16, standard normal components): independent per id,
    except, given the vocabulary's keys (word_keys), word-shaped tokens, whose rows are their
    word's part then their prefix's part."""
    rows = np.random.default_rng([seed, 7]).standard_normal((N_VOCAB, n_embd), dtype=np.float32)
    if keys is None:
        return rows.astype(np.float16)
    word_of, prefix_of = keys
    words = np.random.default_rng([seed, 8]).standard_normal(
        (int(word_of.max()) + 1, n_embd - PREFIX_DIMS), dtype=np.float32
    )
    prefixes = np.random.default_rng([seed, 9]).standard_normal(
        (len(PREFIXES) + 1, PREFIX_DIMS), dtype=np.float32
    )
    shaped = word_of >= 0
    rows[shaped] = np.concatenate(
        [words[word_of[shaped]], prefixes[prefix_of[shaped].astype(np.int64)]], axis=1
    )
    return rows.astype(np.float16)
