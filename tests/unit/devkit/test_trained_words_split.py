"""The trained model's corpus: how the model's own text is written in tokens."""

from __future__ import annotations

from openai_harmony import HarmonyEncoding

from devkit.trained.words import split_prefixes

CALL = (
    "<|channel|>commentary to=functions.apply_patch <|constrain|>json<|message|>"
    '{"input":"*** Update File: settings.toml\\n@@\\n-color = red\\n+color = blue\\n"}<|call|>'
)


def texts(encoding: HarmonyEncoding, tokens: list[int]) -> list[str]:
    return [encoding.decode([t]) for t in tokens]


def test_split_prefixes_writes_a_removed_line_as_dash_then_its_first_word(
    encoding: HarmonyEncoding,
) -> None:
    tokens = encoding.encode(CALL, allowed_special="all")
    assert "-color" in texts(encoding, tokens)  # one token as the tokenizer writes it
    split = split_prefixes(encoding, tokens)
    assert encoding.decode(split) == CALL  # the same text
    out = texts(encoding, split)
    assert "-color" not in out
    i = out.index("-")
    assert out[i : i + 3] == ["-", "color", " ="]
    assert len(split) == len(tokens) + 1  # nothing else changed: `.tom` of the path stays
    assert ".tom" in out


def test_split_prefixes_leaves_text_outside_message_content(encoding: HarmonyEncoding) -> None:
    tokens = encoding.encode("<|start|>user<|message|>", allowed_special="all")
    tokens += encoding.encode("<|end|>-color", allowed_special="all")
    assert split_prefixes(encoding, tokens) == tokens


def test_split_prefixes_with_dots_splits_a_paths_extension_too(encoding: HarmonyEncoding) -> None:
    """`.-` (the committed model's corpus): `.tom` of `settings.toml` as `.` then `tom`."""
    tokens = encoding.encode(CALL, allowed_special="all")
    split = split_prefixes(encoding, tokens, ".-")
    assert encoding.decode(split) == CALL
    out = texts(encoding, split)
    j = out.index(" settings")
    assert out[j : j + 4] == [" settings", ".", "tom", "l"]
    assert ".apply" in out  # the header (before <|message|>) is left as it is


def test_split_prefixes_shortest_keeps_a_two_letter_extension_whole(
    encoding: HarmonyEncoding,
) -> None:
    """shortest=3: `.py` (its bare `py` has no word row) stays as the user wrote it, `.tom`
    and `-color` are split as before."""
    call = CALL.replace("settings.toml", "main.py") + CALL
    tokens = encoding.encode(call, allowed_special="all")
    two = texts(encoding, split_prefixes(encoding, tokens, ".-"))
    three = texts(encoding, split_prefixes(encoding, tokens, ".-", shortest=3))
    assert "".join(three) == "".join(two) == call
    assert ".py" not in two
    assert ".py" in three
    j = three.index(" settings")
    assert three[j : j + 4] == [" settings", ".", "tom", "l"]
    assert "-color" not in three
    assert len(three) == len(two) - 1  # only `.py` differs
