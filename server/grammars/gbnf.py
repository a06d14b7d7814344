"""A small grammar IR and its GBNF writer, including the JSON-string-escaped view of a language.

The Lark and regex converters parse into these nodes; `write` turns named rules into GBNF text.
With `escaped=True` every character is written in the forms a JSON string holds it in (what
`json.dumps` writes: `"` -> `\\"`, `\\` -> `\\\\`, newline -> `\\n`, other control characters
-> `\\uXXXX`), so the grammar describes the *inside of a JSON string* whose decoded value is in
the language.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_CODEPOINT = 0x10FFFF
# Characters a JSON string cannot hold unescaped.
_SPECIALS: tuple[tuple[int, int], ...] = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


class GrammarError(ValueError):
    """A definition that cannot be converted (unsupported syntax or a malformed definition)."""


@dataclass(frozen=True, slots=True)
class Lit:
    text: str


@dataclass(frozen=True, slots=True)
class Chars:
    """A set of code points: sorted, disjoint inclusive ranges (negated: everything else)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Ref:
    name: str


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    item: Node
    min: int
    max: int | None  # None: unbounded


Node = Lit | Chars | Ref | Seq | Alt | Repeat

EMPTY = Seq(())


def normalize(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged ranges."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    start = 0
    for lo, hi in normalize(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODEPOINT:
        out.append((start, MAX_CODEPOINT))
    return tuple(out)


def intersect(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    out = []
    for lo, hi in a:
        for lo2, hi2 in b:
            if max(lo, lo2) <= min(hi, hi2):
                out.append((max(lo, lo2), min(hi, hi2)))
    return normalize(out)


def positive(chars: Chars) -> tuple[tuple[int, int], ...]:
    """The code points a Chars node matches, as ranges."""
    return complement(chars.ranges) if chars.negated else normalize(chars.ranges)


def write(rules: Mapping[str, Node], root: str = "root", *, escaped: bool = False) -> str:
    """GBNF text for `rules` (names must be GBNF rule names: letters, digits, dashes)."""
    lines = [f"{name} ::= {expression(node, escaped)}" for name, node in rules.items()]
    if root not in rules:
        raise GrammarError(f"no rule named {root!r}")
    return "\n".join(lines) + "\n"


def expression(node: Node, escaped: bool) -> str:
    """The GBNF expression of one node."""
    if isinstance(node, Lit):
        text = json.dumps(node.text, ensure_ascii=False)[1:-1] if escaped else node.text
        return literal(text)
    if isinstance(node, Chars):
        return _chars(node, escaped)
    if isinstance(node, Ref):
        return node.name
    return _composite(node, escaped)


def _composite(node: Seq | Alt | Repeat, escaped: bool) -> str:
    if isinstance(node, Seq):
        inner = " ".join(expression(item, escaped) for item in node.items)
        return f"({inner})" if node.items else '""'
    if isinstance(node, Alt):
        return "(" + " | ".join(expression(option, escaped) for option in node.options) + ")"
    inner = expression(node.item, escaped)
    if node.max is None:
        suffix = {0: "*", 1: "+"}.get(node.min, f"{{{node.min},}}")
    elif (node.min, node.max) == (0, 1):
        suffix = "?"
    else:
        suffix = f"{{{node.min},{node.max}}}"
    return f"({inner}){suffix}"


def _chars(node: Chars, escaped: bool) -> str:
    if not escaped:
        return _class(node.ranges, node.negated)
    wanted = positive(node)
    specials = intersect(wanted, _SPECIALS)
    plain_excluded = normalize([*_SPECIALS, *complement(wanted)]) if node.negated else ()
    options = []
    if node.negated:
        options.append(_class(plain_excluded, negated=True))
    else:
        plain = intersect(wanted, complement(_SPECIALS))
        if plain:
            options.append(_class(plain, negated=False))
    for lo, hi in specials:
        for code in range(lo, hi + 1):
            options.append(literal(json.dumps(chr(code))[1:-1]))
    if not options:
        raise GrammarError("an empty character class")
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


def _class(ranges: Iterable[tuple[int, int]], negated: bool) -> str:
    body = "".join(
        _char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in normalize(ranges)
    )
    return f"[{'^' if negated else ''}{body}]"


_SAFE = re.compile(r"[A-Za-z0-9 ]")


def _char(code: int) -> str:
    char = chr(code)
    if _SAFE.fullmatch(char):
        return char
    if code <= 0xFF:
        return f"\\x{code:02X}"
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    return '"' + "".join(_char(ord(c)) for c in text) + '"'


def rule_name(name: str, prefix: str) -> str:
    """A GBNF rule name for a grammar's rule (`add_line` -> `l-add-line`)."""
    return prefix + re.sub(r"[^A-Za-z0-9]", "-", name)
