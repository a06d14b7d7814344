"""GBNF text read back into the grammar IR (server/grammars/gbnf.py), so that
tests/support/grammar_language.py can say whether a text is in a written grammar's language.

A reader of its own, not the server's writer run backwards: rules `name ::= expression`, one a
line; string literals and character classes with llama.cpp's escapes (\\xHH, \\uHHHH,
\\UHHHHHHHH, \\t \\n \\r \\\\ \\" \\[ \\] \\-), `( )`, `|`, rule names, and the postfixes
`* + ? {n} {n,} {n,m}`. Anything else is an error, not a guess."""

from __future__ import annotations

from server.grammars.gbnf import Alt, Chars, Lit, Node, Ref, Repeat, Seq

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX = {"x": 2, "u": 4, "U": 8}
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def parse_gbnf(text: str) -> dict[str, Node]:
    """The rules of a GBNF grammar by name."""
    rules: dict[str, Node] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, body = line.partition(" ::= ")
        assert sep, line
        assert name, line
        assert set(name) <= _NAME, line
        assert name not in rules, f"rule {name} defined twice"
        reader = _Reader(body)
        rules[name] = reader.alternatives()
        reader.skip()
        assert reader.at == len(body), f"trailing text in {line!r} at {reader.at}"
    for node in rules.values():
        _check_refs(node, rules)
    return rules


def _check_refs(node: Node, rules: dict[str, Node]) -> None:
    if isinstance(node, Ref):
        assert node.name in rules, f"undefined rule {node.name}"
    elif isinstance(node, Seq):
        for item in node.items:
            _check_refs(item, rules)
    elif isinstance(node, Alt):
        for option in node.options:
            _check_refs(option, rules)
    elif isinstance(node, Repeat):
        _check_refs(node.item, rules)


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] == " ":
            self.at += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.at] if self.at < len(self.text) else ""

    def alternatives(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> Node:
        char = self.peek()
        if char == "(":
            self.at += 1
            inner = self.alternatives()
            assert self.peek() == ")", f"no ')' at {self.at} in {self.text!r}"
            self.at += 1
            return inner
        if char == '"':
            self.at += 1
            out = []
            while self.text[self.at] != '"':
                out.append(self.char())
            self.at += 1
            return Lit("".join(out))
        if char == "[":
            return self.chars()
        start = self.at
        while self.at < len(self.text) and self.text[self.at] in _NAME:
            self.at += 1
        assert self.at > start, f"unexpected {char!r} at {start} in {self.text!r}"
        return Ref(self.text[start : self.at])

    def chars(self) -> Chars:
        self.at += 1  # [
        negated = self.text[self.at] == "^"
        self.at += negated
        ranges = []
        while self.text[self.at] != "]":
            low = ord(self.char())
            high = low
            if self.text[self.at] == "-" and self.text[self.at + 1] != "]":
                self.at += 1
                high = ord(self.char())
            assert low <= high, f"bad range in {self.text!r}"
            ranges.append((low, high))
        self.at += 1
        return Chars(tuple(ranges), negated)

    def char(self) -> str:
        char = self.text[self.at]
        self.at += 1
        if char != "\\":
            return char
        kind = self.text[self.at]
        self.at += 1
        if kind in _HEX:
            digits = self.text[self.at : self.at + _HEX[kind]]
            assert len(digits) == _HEX[kind], self.text
            self.at += _HEX[kind]
            return chr(int(digits, 16))
        assert kind in _ESCAPES, f"unknown escape \\{kind} in {self.text!r}"
        return _ESCAPES[kind]

    def postfix(self, node: Node) -> Node:
        while self.at < len(self.text) and self.text[self.at] in "*+?{":
            mark = self.text[self.at]
            self.at += 1
            if mark == "*":
                node = Repeat(node, 0, None)
            elif mark == "+":
                node = Repeat(node, 1, None)
            elif mark == "?":
                node = Repeat(node, 0, 1)
            else:
                end = self.text.index("}", self.at)
                low, comma, high = self.text[self.at : end].partition(",")
                self.at = end + 1
                most = int(low) if not comma else int(high) if high else None
                node = Repeat(node, int(low), most)
        return node
