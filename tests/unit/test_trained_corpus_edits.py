"""The trained model's corpus and behaviour check: the new line of a Codex edit."""

from __future__ import annotations

import random
import re

from scripts.train_tiny.corpus import Values

WORDS = ["blue", "mode", "fast"]


def test_without_value_edits_the_new_line_is_a_fresh_line_and_draws_nothing_else() -> None:
    # the corpus and the behaviour check of runs before --value-edits stay the same draws
    a, b = Values(random.Random(3), WORDS), Values(random.Random(3), WORDS)
    assert a.replacement("color = red") == b.line()
    assert a.rng.random() == b.rng.random()


def test_a_value_edit_changes_only_the_lines_last_value() -> None:
    v = Values(random.Random(3), ["blue"], value_edits=1.0)
    assert v.replacement("color = red") == "color = blue"
    assert v.replacement("def size(red):") == "def size(blue):"
    assert re.fullmatch(r"let limit = [0-9]+;", v.replacement("let limit = 42;"))
