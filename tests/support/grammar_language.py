"""Whether a text is in the language of a grammar IR node (server/grammars/gbnf.py): the
positions a node's matches can end at, followed through sequences, alternatives and repeats.
What a converter's output means, checked against another reader of the same definition (Python's
`re` for a regex) without going through GBNF and llama.cpp."""

from __future__ import annotations

from collections.abc import Mapping

from server.grammars.gbnf import Alt, Chars, Lit, Node, Ref, Repeat, Seq


def in_language(node: Node, text: str, rules: Mapping[str, Node] | None = None) -> bool:
    """Whether the whole of `text` is a match of `node` (`rules`: what a Ref names)."""
    return len(text) in _ends(node, text, 0, rules or {})


def _ends(node: Node, text: str, start: int, rules: Mapping[str, Node]) -> set[int]:
    if isinstance(node, Lit):
        return {start + len(node.text)} if text.startswith(node.text, start) else set()
    if isinstance(node, Chars):
        return {start + 1} if _holds(node, text, start) else set()
    if isinstance(node, Ref):
        return _ends(rules[node.name], text, start, rules)
    if isinstance(node, Seq):
        positions = {start}
        for item in node.items:
            positions = {end for p in positions for end in _ends(item, text, p, rules)}
        return positions
    if isinstance(node, Alt):
        return {end for option in node.options for end in _ends(option, text, start, rules)}
    assert isinstance(node, Repeat)
    return _repeat_ends(node, text, start, rules)


def _holds(chars: Chars, text: str, start: int) -> bool:
    """Whether the character at `start` is one of `chars`."""
    if start >= len(text):
        return False
    held = any(lo <= ord(text[start]) <= hi for lo, hi in chars.ranges)
    return held != chars.negated


def _repeat_ends(node: Repeat, text: str, start: int, rules: Mapping[str, Node]) -> set[int]:
    found = {start} if node.min == 0 else set()
    current = {start}
    most = node.max if node.max is not None else len(text) + 1
    for count in range(1, most + 1):
        current = {end for p in current for end in _ends(node.item, text, p, rules)}
        if not current:
            break
        if count >= node.min:
            found |= current
    return found
