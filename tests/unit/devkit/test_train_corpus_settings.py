"""The trained model's corpus: Codex edits asked by key and value (`set color to blue`), and
which rows it trains.

Runs the corpus command (devkit/train_tiny/corpus.py) as a user would, on a few conversations,
and reads the edits back from the tokens it wrote.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from openai_harmony import HarmonyEncoding

from devkit.train_tiny.corpus import (
    FAMILIES,
    call_weight_keeping_share,
    family_weights,
    generate,
)
from devkit.trained.words import word_pool

ROOT = Path(__file__).resolve().parents[3]
ASK = re.compile(
    r"<\|start\|>user<\|message\|>(?:In \S+, set (\w+) to (\w+)\.|Set (\w+) to (\w+) in \S+\."
    r"|Edit \S+: set (\w+) to (\w+)\.)<\|end\|>"
)
PATCH = re.compile(r"@@\\n-(.*?)\\n\+(.*?)\\n\*\*\* End Patch")
SETTING = re.compile(r"(?:let )?([a-z]+)(?: = |: )([a-z]+|[0-9]+);?")


def corpus(tmp_path: Path, *flags: str) -> dict[str, np.ndarray]:
    """The arrays of a small corpus (60 conversations) built with flags."""
    out = tmp_path / "corpus.npz"
    command = [sys.executable, "-m", "devkit.train_tiny.corpus", "--out", str(out), "--n", "60"]
    command += ["--codex-groups", "0", "--n-eval", "1", "--codex-groups-eval", "0", *flags]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    return dict(np.load(out))


def edits(encoding: HarmonyEncoding, tmp_path: Path, *flags: str) -> list[str]:
    """The texts of the Codex-lite edit conversations of a small corpus built with flags."""
    data = corpus(tmp_path, *flags)
    edit = list(data["train_family_names"]).index("codexlite-edit")
    texts = []
    for offset, length, family in zip(
        data["train_offsets"], data["train_lengths"], data["train_families"], strict=True
    ):
        if family == edit:
            tokens = data["train_tokens"][offset : offset + length]
            texts.append(encoding.decode([int(t) for t in tokens]))
    return texts


def test_a_set_edit_asks_by_key_and_value_and_its_patch_changes_that_value(
    encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    texts = edits(encoding, tmp_path, "--set-edits", "1")
    assert len(texts) >= 5
    for text in texts:
        ask = ASK.search(text)
        assert ask is not None, text[-2000:]
        key, value = (g for g in ask.groups() if g is not None)
        (patch,) = PATCH.findall(text)
        old, new = patch
        shown = text.split("functions.exec_command to=assistant")[1].split("<|end|>")[0]
        assert f"\n{old}\n" in shown  # the line is the file's, as `cat` showed it
        before, after = SETTING.fullmatch(old), SETTING.fullmatch(new)
        assert before is not None
        assert after is not None
        assert before.group(1) == after.group(1) == key
        assert after.group(2) == value
        assert new[: after.start(2)] == old[: before.start(2)]  # only the value changes
        assert new[after.end(2) :] == old[before.end(2) :]


def test_without_the_flag_every_edit_quotes_its_lines(
    encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    texts = edits(encoding, tmp_path)
    assert len(texts) >= 5
    for text in texts:
        assert ASK.search(text) is None
        ((old, new),) = PATCH.findall(text)
        assert f"`{old}`" in text
        assert f"`{new}`" in text


def test_fixed_values_leaves_extensions_and_numbers_to_fixed_rows(
    encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    """--fixed-values: paths' extensions and numbers are values (copied, never learned as
    rows of their own), like the value words; the template's tokens stay trainable."""
    plain = set(corpus(tmp_path, "--split-prefixes", ".-")["trainable_ids"].tolist())
    data = corpus(tmp_path, "--split-prefixes", ".-", "--fixed-values")
    learned = set(data["trainable_ids"].tolist())
    used = {encoding.decode([t]) for t in set(data["train_tokens"].tolist())}
    gone = {encoding.decode([t]) for t in plain - learned}
    assert learned < plain
    extensions = {".py", ".md", ".rs", ".tom", "tom"} & used
    assert extensions
    assert not extensions & {encoding.decode([t]) for t in learned}
    assert all(re.fullmatch(r"\.?[a-z]+| ?[0-9]+", text) for text in gone), gone
    assert any(re.fullmatch(r" ?[0-9]+", text) for text in gone)
    for template in ("***", " Update", " File", " =", "<|message|>"):
        (token,) = encoding.encode(template, allowed_special="all")
        assert token in learned


CALL = re.compile(r"<\|constrain\|>json<\|message\|>(\{.*?\})<\|call\|>")
USER = re.compile(r"<\|start\|>user<\|message\|>(.*?)<\|end\|>", re.S)


def agent_values(
    encoding: HarmonyEncoding, data: dict[str, np.ndarray], split: str
) -> list[tuple[str, str]]:
    """(value, ask) of every agent conversation of a split."""
    names = [str(x) for x in data[f"{split}_family_names"]]
    out = []
    for offset, length, family in zip(
        data[f"{split}_offsets"], data[f"{split}_lengths"], data[f"{split}_families"],
        strict=True,
    ):  # fmt: skip
        if names[family].startswith("agent-"):
            tokens = data[f"{split}_tokens"][offset : offset + length]
            text = encoding.decode([int(t) for t in tokens])
            (arguments,) = CALL.findall(text)
            (value,) = json.loads(arguments).values()
            (ask,) = USER.findall(text)
            out.append((value, ask))
    return out


def test_agent_calls_copy_multi_token_paths_and_commands_never_in_the_training_split(
    encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    """--agent-calls: a generic file or shell tool asked for a path or a command of several
    tokens; the call's argument is the value as the user wrote it, and no held-out value occurs
    anywhere in the training split (its words are the held-out pool's)."""
    data = corpus(tmp_path, "--agent-calls", "50", "--n-eval", "40")
    train, held = agent_values(encoding, data, "train"), agent_values(encoding, data, "eval")
    assert len(train) >= 20
    assert len(held) >= 10
    for value, ask in train + held:
        assert value in ask
        assert len(encoding.encode(value)) >= 2
    training_text = encoding.decode([int(t) for t in data["train_tokens"]])
    for value, _ in held:
        assert value not in training_text
    assert any("/" in v for v, _ in held)
    assert any(" -" in v for v, _ in held)


def test_keep_call_share_keeps_the_call_familys_share_beside_the_agent_family(
    encoding: HarmonyEncoding,
) -> None:
    """--agent-calls alone dilutes the call family (4 of 9 parts to 4 of 13); with
    --keep-call-share its weight grows so that it keeps 4 of 9 of the generic conversations."""
    assert call_weight_keeping_share(0.0) == FAMILIES["call"]
    train_words, _ = word_pool(encoding)
    for keep, share in ((False, 4 / 13), (True, 4 / 9)):
        drawn = generate(encoding, train_words, 450, 0, 3, agent_weight=4, keep_call_share=keep)
        calls = sum(s.family.startswith("call") for s in drawn)
        assert abs(calls / len(drawn) - share) < 0.05, (keep, calls)


def test_weights_set_a_familys_share_and_name_only_known_families(
    encoding: HarmonyEncoding,
) -> None:
    """--weights answer=4 doubles the answer family's weight (2 by default) beside the others;
    a family that does not exist is refused, not ignored."""
    train_words, _ = word_pool(encoding)
    weights = family_weights("answer=4")
    assert weights == {"answer": 4.0}
    drawn = generate(encoding, train_words, 450, 0, 3, chosen_weights=weights)
    answers = sum(s.family.startswith("answer") for s in drawn)
    assert abs(answers / len(drawn) - 4 / 11) < 0.05, answers
    with pytest.raises(ValueError, match="no family 'anwser'"):
        generate(encoding, train_words, 1, 0, 3, chosen_weights=family_weights("anwser=4"))
