"""Batch: what llama_decode reads through the llama_batch struct after `fill`."""

from __future__ import annotations

from typing import Any

import pytest

from server.engine.batch import Batch, BatchPart


def read(batch: Batch) -> list[tuple[Any, ...]]:
    """(token, pos, n_seq_id, seq_id, logits) of every token, read through the C pointers."""
    s = batch.struct
    return [
        (s.token[i], s.pos[i], s.n_seq_id[i], s.seq_id[i][0], s.logits[i])
        for i in range(s.n_tokens)
    ]


def test_parts_are_laid_out_in_order_with_their_logits_flags() -> None:
    batch = Batch(16)
    parts = [BatchPart(2, (7,), 40, True), BatchPart(0, [1, 2, 3], 5, True)]
    assert batch.fill(parts) == [0, 3]
    assert read(batch) == [
        (7, 40, 1, 2, 1),
        (1, 5, 1, 0, 0),
        (2, 6, 1, 0, 0),
        (3, 7, 1, 0, 1),
    ]


def test_reuse_clears_the_previous_flags() -> None:
    batch = Batch(8)
    batch.fill([BatchPart(1, [9, 9, 9, 9], 0, True)])
    assert batch.fill([BatchPart(3, [4, 5], 10, False)]) == [-1]
    assert read(batch) == [(4, 10, 1, 3, 0), (5, 11, 1, 3, 0)]


def test_overfull_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 4"):
        Batch(4).fill([BatchPart(0, [1, 2, 3], 0, False), BatchPart(1, [4, 5], 0, True)])


def test_more_outputs_than_tokens_are_refused() -> None:
    """A part's logits rows are its last `outputs` tokens: asking for more is a caller's
    mistake, never a batch that silently keeps none."""
    with pytest.raises(ValueError, match="65 outputs asked of 64 tokens"):
        Batch(128).fill([BatchPart(0, range(64), 64, True, 65)])
    with pytest.raises(ValueError, match="0 outputs"):
        Batch(8).fill([BatchPart(0, [1, 2], 0, True, 0)])
