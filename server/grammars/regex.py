"""Regular expressions (the subset tool definitions use) parsed into the grammar IR.

Supported: literals and escapes, `.`, classes `[...]` / `[^...]` with ranges and `\\d \\w \\s`
(and their negations), groups `(...)` / `(?:...)` / `(?P<name>...)`, alternation, the
quantifiers `? * + {n} {n,} {n,m}` (lazy ones are read as greedy), and `^` / `$` at the ends
(a definition always matches the whole input). Anything else (look-arounds, back-references,
inline flags) raises GrammarError.
"""

from __future__ import annotations

from server.grammars.gbnf import (
    MAX_CODEPOINT,
    Alt,
    Chars,
    GrammarError,
    Lit,
    Node,
    Repeat,
    Seq,
    complement,
    normalize,
)

DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}
_MAX_REPEAT = 1000
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def parse_regex(pattern: str, *, dotall: bool = False) -> Node:
    """The regex as a grammar node; raises GrammarError when it uses unsupported syntax."""
    parser = _Parser(pattern, dotall)
    node = parser.alternation()
    if parser.pos != len(pattern):
        raise GrammarError(f"unbalanced ')' at {parser.pos} in /{pattern}/")
    return node


class _Parser:
    def __init__(self, pattern: str, dotall: bool) -> None:
        self.text = pattern
        self.pos = 0
        self.dotall = dotall

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        if self.pos >= len(self.text):
            raise GrammarError(f"unexpected end of /{self.text}/")
        char = self.text[self.pos]
        self.pos += 1
        return char

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            char = self.peek()
            if char in "^$":
                self._anchor(char)
                continue
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def _anchor(self, char: str) -> None:
        at_start = self.pos == 0 or self.text[self.pos - 1] in "(|"
        at_end = self.pos + 1 == len(self.text) or self.text[self.pos + 1] in ")|"
        if (char == "^" and not at_start) or (char == "$" and not at_end):
            raise GrammarError(f"anchor {char!r} inside /{self.text}/")
        self.pos += 1

    def atom(self) -> Node:
        char = self.take()
        if char == "(":
            return self._group()
        if char == "[":
            return self._class()
        if char == ".":
            return Chars(() if self.dotall else ((0x0A, 0x0A),), negated=True)
        if char == "\\":
            return self._escape()
        if char in "*+?{":
            raise GrammarError(f"nothing to repeat at {self.pos - 1} in /{self.text}/")
        return Lit(char)

    def _group(self) -> Node:
        if self.peek() == "?":
            self.pos += 1
            kind = self.take()
            if kind == "P" and self.peek() == "<":
                self.pos = self.text.index(">", self.pos) + 1
            elif kind != ":":
                raise GrammarError(f"unsupported group (?{kind} in /{self.text}/")
        node = self.alternation()
        self.take()  # its ')': an alternation stops there or at the end, where `take` raises
        return node

    def _escape(self) -> Node:
        char = self.take()
        if char in _CLASS_ESCAPES:
            return Chars(_CLASS_ESCAPES[char])
        if char.lower() in _CLASS_ESCAPES:
            return Chars(_CLASS_ESCAPES[char.lower()], negated=True)
        return Lit(self._escaped_char(char))

    def _escaped_char(self, char: str) -> str:
        if char in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[char]
        if char in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[char]
            digits = self.text[self.pos : self.pos + width]
            if len(digits) != width or not all(d in _HEX_DIGITS for d in digits):
                raise GrammarError(f"bad \\{char} escape in /{self.text}/")
            if int(digits, 16) > MAX_CODEPOINT:
                raise GrammarError(f"\\{char}{digits} is no code point in /{self.text}/")
            self.pos += width
            return chr(int(digits, 16))
        if char.isalnum():
            raise GrammarError(f"unsupported escape \\{char} in /{self.text}/")
        return char

    def _class(self) -> Node:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while first or self.peek() != "]":
            first = False
            char = self.take()
            if char == "\\":
                escaped = self.take()
                low = escaped.lower()
                if low in _CLASS_ESCAPES:
                    part = _CLASS_ESCAPES[low]
                    ranges.extend(part if escaped == low else complement(part))
                    continue
                char = self._escaped_char(escaped)
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                end = self.take()
                if end == "\\":
                    end = self._escaped_char(self.take())
                if ord(end) < ord(char):
                    raise GrammarError(f"bad range {char}-{end} in /{self.text}/")
                ranges.append((ord(char), ord(end)))
            else:
                ranges.append((ord(char), ord(char)))
        self.pos += 1
        return Chars(normalize(ranges), negated)

    def quantified(self, node: Node) -> Node:
        while True:
            char = self.peek()
            if char == "?":
                node = Repeat(node, 0, 1)
            elif char == "*":
                node = Repeat(node, 0, None)
            elif char == "+":
                node = Repeat(node, 1, None)
            elif char == "{" and (bounds := self._bounds()) is not None:
                self.pos = self.text.index("}", self.pos)
                node = Repeat(node, *bounds)
            else:
                return node
            self.pos += 1
            if self.peek() in ("?", "+"):
                self.pos += 1  # lazy or possessive: read as greedy

    def _bounds(self) -> tuple[int, int | None] | None:
        end = self.text.find("}", self.pos)
        if end < 0:
            return None
        body = self.text[self.pos + 1 : end]
        low_text, comma, high_text = body.partition(",")
        if not low_text.isdigit() or (high_text and not high_text.isdigit()):
            return None
        low = int(low_text)
        high = int(high_text) if high_text else (None if comma else low)
        if max(low, high or 0) > _MAX_REPEAT or (high is not None and high < low):
            raise GrammarError(f"repetition {{{body}}} out of range in /{self.text}/")
        return low, high
