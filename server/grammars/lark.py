"""Lark grammars (the subset tool definitions use) parsed into the grammar IR.

Supported: rules and terminals (`name: ...`, `NAME: ...`, with `?`/`!` prefixes and priorities),
alternatives (also on `|` continuation lines), `?` `*` `+` `[...]` `~n` `~n..m`, groups, string
literals (with `i`), `"a".."z"` ranges, `/regex/` terminals (flag `s`), `-> alias` (ignored:
it names the tree node, not the language), `%import common.NAME` (and `-> ALIAS`,
`common (A, B)`), comments. `%ignore`, `%declare`, templates and other imports raise
GrammarError (the caller then leaves the tool's input free).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from server.grammars.gbnf import (
    Alt,
    Chars,
    GrammarError,
    Lit,
    Node,
    Ref,
    Repeat,
    Seq,
    rule_name,
)
from server.grammars.regex import parse_regex

PREFIX = "l-"
START = "start"

_COMMON = {  # lark's common.lark, as regexes
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(\r?\n)+",
    "WS": r"[ \t\f\r\n]+",
    "WS_INLINE": r"[ \t]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[0-9a-fA-F]",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[a-zA-Z]",
    "WORD": r"[a-zA-Z]+",
    "CNAME": r"[_a-zA-Z][_a-zA-Z0-9]*",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"[0-9]+\.[0-9]*|\.[0-9]+",
    "NUMBER": r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?",
    "SIGNED_NUMBER": r"[+-]?([0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?)",
    "ESCAPED_STRING": r'"([^"\\]|\\.)*"',
    "SH_COMMENT": r"#[^\n]*",
    "CPP_COMMENT": r"//[^\n]*",
}

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t]+)
    | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
    | (?P<regexp>/(?:[^/\\\n]|\\.)+/[imslux]*)
    | (?P<arrow>->)
    | (?P<dots>\.\.)
    | (?P<number>[0-9]+)
    | (?P<name>[_A-Za-z][_A-Za-z0-9]*)
    | (?P<op>[|()\[\]?*+~])
    """,
    re.VERBOSE,
)
_DEFINITION = re.compile(r"^([?!]?)([_A-Za-z][_A-Za-z0-9]*)(\.-?[0-9]+)?\s*:\s*(.*)$")


def parse_lark(definition: str) -> dict[str, Node]:
    """GBNF rule name -> node for every rule and terminal; the start rule is `l-start`."""
    rules: dict[str, Node] = {}
    for line in _logical_lines(definition):
        if line.startswith("%"):
            rules.update(_directive(line))
            continue
        match = _DEFINITION.match(line)
        if match is None:
            raise GrammarError(f"cannot read the grammar line {line[:60]!r}")
        name, body = match.group(2), match.group(4)
        rules[rule_name(name, PREFIX)] = _Expansions(body).parse()
    start = rule_name(START, PREFIX)
    if start not in rules:
        raise GrammarError("the grammar has no `start` rule")
    _check_refs(rules)
    return rules


def _logical_lines(definition: str) -> Iterator[str]:
    current: list[str] = []
    for raw in definition.splitlines():
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if line.startswith("|") and current:
            current.append(line)
            continue
        if current:
            yield " ".join(current)
        current = [line]
    if current:
        yield " ".join(current)


def _strip_comment(line: str) -> str:
    """`line` without a `//` comment (outside strings and regexes)."""
    position = 0
    while position < len(line):
        match = _TOKEN.match(line, position)
        if match is None:
            if line.startswith("//", position):
                return line[:position]
            position += 1
            continue
        position = match.end()
    return line


def _directive(line: str) -> dict[str, Node]:
    parts = line.split()
    if parts[0] != "%import" or len(parts) < 2:
        raise GrammarError(f"unsupported directive {parts[0]}")
    rest = " ".join(parts[1:])
    grouped = re.fullmatch(r"common\s*\(([^)]*)\)", rest)
    if grouped:
        names = [(n.strip(), n.strip()) for n in grouped.group(1).split(",") if n.strip()]
    else:
        single = re.fullmatch(r"common\.([A-Z_]+)(?:\s*->\s*([A-Za-z_][A-Za-z0-9_]*))?", rest)
        if single is None:
            raise GrammarError(f"unsupported import {rest!r}")
        names = [(single.group(1), single.group(2) or single.group(1))]
    imported: dict[str, Node] = {}
    for name, alias in names:
        if name not in _COMMON:
            raise GrammarError(f"unsupported import common.{name}")
        imported[rule_name(alias, PREFIX)] = parse_regex(_COMMON[name])
    return imported


def _check_refs(rules: dict[str, Node]) -> None:
    def visit(node: Node) -> None:
        if isinstance(node, Ref) and node.name not in rules:
            raise GrammarError(f"undefined name {node.name[len(PREFIX) :]!r}")
        if isinstance(node, Seq):
            for item in node.items:
                visit(item)
        elif isinstance(node, Alt):
            for option in node.options:
                visit(option)
        elif isinstance(node, Repeat):
            visit(node.item)

    for node in rules.values():
        visit(node)


class _Expansions:
    """A recursive-descent reader of one definition's right-hand side."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = self._tokens(text)
        self.pos = 0

    @staticmethod
    def _tokens(text: str) -> list[tuple[str, str]]:
        tokens, position = [], 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                raise GrammarError(f"unexpected {text[position : position + 10]!r} in {text!r}")
            position = match.end()
            kind = match.lastgroup or ""
            if kind != "ws":
                tokens.append((kind, match.group()))
        return tokens

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.pos += 1
        return token

    def parse(self) -> Node:
        node = self.expansions()
        if self.peek()[0] != "end":
            raise GrammarError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return node

    def expansions(self) -> Node:
        options = [self.alias_expansion()]
        while self.peek() == ("op", "|"):
            self.pos += 1
            options.append(self.alias_expansion())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias_expansion(self) -> Node:
        items: list[Node] = []
        while self.peek()[0] in ("string", "regexp", "name") or self.peek()[1] in ("(", "["):
            items.append(self.expr())
        if self.peek()[0] == "arrow":
            self.pos += 1
            if self.take()[0] != "name":
                raise GrammarError(f"bad alias in {self.text!r}")
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def expr(self) -> Node:
        node = self.atom()
        value = self.peek()[1]
        if value in ("?", "*", "+"):
            self.pos += 1
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[value]
            return Repeat(node, low, high)
        if value == "~":
            self.pos += 1
            low = int(self._expect("number"))
            high = low
            if self.peek()[0] == "dots":
                self.pos += 1
                high = int(self._expect("number"))
            return Repeat(node, low, high)
        return node

    def _expect(self, kind: str) -> str:
        got, value = self.take()
        if got != kind:
            raise GrammarError(f"expected {kind}, got {value!r} in {self.text!r}")
        return value

    def atom(self) -> Node:
        kind, value = self.take()
        if value in ("(", "["):
            inner = self.expansions()
            closing = ")" if value == "(" else "]"
            if self.take()[1] != closing:
                raise GrammarError(f"missing {closing!r} in {self.text!r}")
            return inner if value == "(" else Repeat(inner, 0, 1)
        if kind == "string":
            return self._string(value)
        if kind == "regexp":
            return _regexp(value)
        return Ref(rule_name(value, PREFIX))  # a name: `alias_expansion` reads atoms only there

    def _string(self, token: str) -> Node:
        text = _unquote(token)
        if self.peek()[0] == "dots":
            self.pos += 1
            end = _unquote(self._expect("string"))
            if len(text) != 1 or len(end) != 1 or end < text:
                raise GrammarError(f"bad range {token}..{end!r}")
            return Chars(((ord(text), ord(end)),))
        if token.endswith("i"):
            return Seq(tuple(_either_case(c) for c in text))
        return Lit(text)


def _unquote(token: str) -> str:
    quoted = token[:-1] if token.endswith("i") else token
    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError) as exc:
        raise GrammarError(f"bad string {token}") from exc
    assert isinstance(value, str)  # the token is one double-quoted literal
    return value


def _either_case(char: str) -> Node:
    upper, lower = char.upper(), char.lower()
    if upper == lower or len(upper) != 1 or len(lower) != 1:
        return Lit(char)
    return Chars(((ord(upper), ord(upper)), (ord(lower), ord(lower))))


def _regexp(token: str) -> Node:
    body, _, flags = token[1:].rpartition("/")
    if set(flags) - {"s"}:
        raise GrammarError(f"unsupported regex flags {flags!r}")
    return parse_regex(body.replace("\\/", "/"), dotall="s" in flags)
