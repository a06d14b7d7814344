"""The trained model's fixed rows: a word's tokens share its part, prefixes tell them apart."""

from __future__ import annotations

import numpy as np

from devkit.trained import rows as trained_rows
from server.contracts.vocabulary import N_VOCAB

TOKENS = [b"silver", b" silver", b"_silver", b"-silver", b" pepper", b"Silver", b"ab", b'{"']


def test_word_keys_group_a_words_tokens_by_prefix() -> None:
    word_of, prefix_of = trained_rows.word_keys(TOKENS)
    assert len(word_of) == len(prefix_of) == N_VOCAB
    silver, pepper = word_of[0], word_of[4]
    assert list(word_of[:4]) == [silver] * 4
    assert silver != pepper >= 0
    assert list(prefix_of[:5]) == [0, 1, 2, 5, 1]
    assert list(word_of[5:8]) == [-1, -1, -1]  # capitalised, too short, punctuation
    assert (word_of[len(TOKENS) :] == -1).all()


def test_word_rows_share_the_word_part_and_differ_in_the_prefix_part() -> None:
    rows = trained_rows.random_rows(3, 32, trained_rows.word_keys(TOKENS)).astype(np.float32)
    split = 32 - trained_rows.PREFIX_DIMS
    assert np.array_equal(rows[0, :split], rows[1, :split])
    assert np.array_equal(rows[1, :split], rows[3, :split])
    assert not np.array_equal(rows[0, split:], rows[1, split:])
    assert np.array_equal(rows[1, split:], rows[4, split:])  # the same prefix: the same part
    assert not np.array_equal(rows[1, :split], rows[4, :split])


def test_without_keys_every_row_is_independent_and_as_before() -> None:
    independent = trained_rows.random_rows(3, 32, None)
    expected = np.random.default_rng([3, 7]).standard_normal((N_VOCAB, 32), dtype=np.float32)
    assert np.array_equal(independent, expected.astype(np.float16))
    keyed = trained_rows.random_rows(3, 32, trained_rows.word_keys(TOKENS))
    assert np.array_equal(keyed[len(TOKENS) :], independent[len(TOKENS) :])


def test_words_after_a_prefix_left_out_keep_whole_rows() -> None:
    tokens = [b"toml", b".toml", b" toml", b"-toml"]
    word_of, prefix_of = trained_rows.word_keys(tokens, shared=b" _/-")
    assert word_of[1] == -1  # `.toml`: an extension, copied whole
    assert prefix_of[1] == 0
    assert word_of[0] == word_of[2] == word_of[3] >= 0
    assert list(prefix_of[[0, 2, 3]]) == [0, 1, 5]  # the classes of PREFIXES, as before
    rows = trained_rows.random_rows(3, 32, (word_of, prefix_of))
    assert np.array_equal(rows[1], trained_rows.random_rows(3, 32, None)[1])
