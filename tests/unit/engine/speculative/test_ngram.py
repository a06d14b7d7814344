"""NgramDrafter: drafts continue the longest n-gram ending the sequence from its last occurrence."""

from __future__ import annotations

import random

from server.engine.speculative.ngram import ORDERS, Draft, NgramDrafter


def test_drafts_what_followed_the_last_tokens() -> None:
    drafter = NgramDrafter([5, 6, 7, 8, 9, 10, 1, 2, 6, 7])
    assert drafter.draft(3) == Draft((8, 9, 10), 2)  # "6 7" -> 8 9 10
    drafter.append(8)
    assert drafter.draft(2) == Draft((9, 10), 3)  # "6 7 8"


def test_the_latest_occurrence_wins_and_the_longest_order_first() -> None:
    drafter = NgramDrafter([1, 2, 3, 9, 2, 3, 4, 0, 3])
    assert drafter.draft(1) == Draft((4,), 1)  # "3" last followed by 4
    drafter.append(2)
    drafter.append(3)
    assert drafter.draft(2) == Draft((4, 0), 2)  # "2 3": latest occurrence
    assert NgramDrafter([1, 2, 3, 9, 2, 3]).draft(5) == Draft((9, 2, 3), 2)


def test_no_draft_without_an_earlier_occurrence() -> None:
    assert NgramDrafter([1, 2, 3]).draft(4) is None
    assert NgramDrafter([]).draft(4) is None
    assert NgramDrafter([1, 2, 1]).draft(0) is None


def test_a_draft_never_runs_past_the_sequence() -> None:
    drafter = NgramDrafter([4, 5, 4])
    assert drafter.draft(8) == Draft((5, 4), 1)


def test_a_long_prompt_is_indexed_as_if_appended_one_by_one() -> None:
    rng = random.Random(3)
    tokens = [
        rng.randrange(200_000, 201_088) if rng.random() < 0.1 else rng.randrange(50)
        for _ in range(600)
    ]
    bulk = NgramDrafter(tokens[:300])
    bulk.extend(tokens[300:])
    single = NgramDrafter([])
    for token in tokens:
        single.append(token)
    assert bulk.tokens == single.tokens
    for n in ORDERS:
        assert bulk._index[n] == single._index[n]
    for cut in range(10, 600, 37):
        prefix = tokens[:cut]
        assert NgramDrafter(prefix).draft(6) == _slow_draft(prefix, 6)


def _slow_draft(tokens: list[int], limit: int) -> Draft | None:
    """The definition: the longest n-gram ending the sequence, at its latest earlier start."""
    for n in ORDERS:
        if len(tokens) < n + 1:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = start + n
                return Draft(tuple(tokens[follow : follow + limit]), n)
    return None
