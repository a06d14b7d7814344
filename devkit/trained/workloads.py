"""Agent turns for the trained tiny gpt-oss: prompts drawn like its corpus, from held-out words.

Each workload is a round of a corpus conversation, cut where the model's turn starts, so the
model writes the turn itself (no forced script): a Codex-shaped apply_patch edit of the file it
has just read (under Codex's short head, and under its full ≈7.9k-token request as Codex CLI
sends it), a function call copying the user's values, and an answer quoting a tool result. A
workload has one prompt per benchmark round (other values each time).
"""

from __future__ import annotations

import random

from devkit.train_tiny.corpus import Sequence as Conversation
from devkit.train_tiny.corpus import (
    Values,
    codex_cwd,
    codex_home,
    date_of,
    encoding,
    family_call,
    family_codex,
)
from devkit.trained.words import word_pool

# workload: (family whose conversations it takes, index of the model's round)
ROUNDS = {
    "trained_apply_patch": ("codexlite-edit", 1),
    "trained_codex_patch": ("codex-edit", 1),
    "trained_call": ("call", 0),
    "trained_quote_result": ("call", 1),
}


def prompt_of(conversation: Conversation, index: int) -> list[int]:
    start, _ = conversation.rounds[index]
    return conversation.tokens[:start]


def trained_cases(rounds: int, seed: int = 7) -> dict[str, list[list[int]]]:
    """Per workload, `rounds` prompts (token ids ending where the model's turn starts)."""
    enc = encoding()
    _, held = word_pool(enc)
    v = Values(random.Random(seed), held)
    cases: dict[str, list[list[int]]] = {name: [] for name in ROUNDS}
    while any(len(prompts) < rounds for prompts in cases.values()):
        conversations = [
            family_call(enc, v),
            family_codex(enc, v, date_of(v), codex_home(v), codex_cwd(v), lite=True),
            family_codex(enc, v, date_of(v), codex_home(v), codex_cwd(v), lite=False),
        ]
        for name, (family, index) in ROUNDS.items():
            for conversation in conversations:
                if conversation.family == family and len(cases[name]) < rounds:
                    cases[name].append(prompt_of(conversation, index))
    return cases
