"""The trained tests' floors: each set by its rule, and the baseline that copies one item in ten."""

from __future__ import annotations

from openai_harmony import HarmonyEncoding

from devkit import floors
from devkit.trained.words import word_pool


def test_every_floor_is_the_committed_count_less_the_margin_and_above_the_baseline() -> None:
    for floor in floors.FLOORS.values():
        assert floor.least == floor.committed - floors.MARGIN, floor
        assert floor.baseline < floor.least <= floor.items, floor


def prompt(encoding: HarmonyEncoding, tool: str, user: str) -> list[int]:
    text = (
        f"<|start|>developer<|message|>namespace functions {{ type {tool} = () => any; }}<|end|>"
        f"<|start|>user<|message|>{user}<|end|><|start|>assistant"
    )
    return encoding.encode(text, allowed_special="all")


def test_the_baseline_spoils_the_values_of_all_items_but_one_in_ten(
    encoding: HarmonyEncoding,
) -> None:
    assert encoding.encode("user") == [floors.USER]
    held = word_pool(encoding)[1]
    words = [w for w in held if len(encoding.encode(w)) == 1 and len(encoding.encode(" " + w)) == 1]
    split = next(w for w in held if len(encoding.encode(" " + w)) > 1)  # ` azi` `uns`
    hook = floors.Generations(encoding, copy_one_in=10)
    tool, value = words[0], words[1:12]
    value_tokens = [encoding.encode(" " + w)[0] for w in value]
    tool_token = encoding.encode(" " + tool)[0]
    spoiled = []
    for i, word in enumerate(value):  # eleven items: 0 and 10 copy
        choose = hook(prompt(encoding, tool, f"Call {tool} on {word} {split}."))
        assert choose is not None
        assert choose(tool_token) == tool_token  # a word the rest of the prompt holds: kept
        spoiled.append(choose(value_tokens[i]) != value_tokens[i])
        pieces = encoding.encode(" " + split)
        assert ([choose(t) for t in pieces] != pieces) == spoiled[-1]  # a word in pieces too
    assert spoiled == [False, *[True] * 9, False]
    swapped = hook.log[1].chosen[1]
    assert encoding.decode([swapped]).startswith(" ")
    assert encoding.decode([swapped]).strip() in held
    again = hook(prompt(encoding, tool, f"Call {tool} on {value[1]} {split}."))  # the same item
    assert again is not None
    assert again(value_tokens[1]) == swapped
    plain = floors.Generations(encoding)  # no baseline: records only
    choose = plain(prompt(encoding, tool, f"Call {tool} on {value[1]}."))
    assert choose is not None
    assert choose(value_tokens[1]) == value_tokens[1]
    assert plain.log[0].chosen == [value_tokens[1]]
