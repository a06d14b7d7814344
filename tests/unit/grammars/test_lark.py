"""The Lark converter's language is Lark's: for grammars that use each supported construct,
every text of a small alphabet is in the converted rules exactly when the `lark` library itself
(Earley, every tokenization tried) parses it; what the converter does not support is refused
with its reason."""

from __future__ import annotations

import itertools

import pytest
from lark import Lark
from lark.exceptions import LarkError

from server.grammars.gbnf import GrammarError
from server.grammars.lark import parse_lark
from tests.support.grammar_language import in_language

GRAMMARS = [
    # strings, rules, alternatives, + and a case-insensitive string, ranges with ~n..m
    ('start: "a" b+ | "x"i c\nb: "b" | "1"\nc: ("a".."c")~2..3', "ab1xXc"),
    ('start: "ab"i "c"~2', "abABc"),
    ('start: "ßé"i', "ßéÉS"),  # ß has no one-letter upper case: as it is
    # terminals, a regexp terminal, groups with * and a literal space
    ('start: WORD (" " WORD)*\nWORD: /[a-b]+/', "ab "),
    # ? and ! prefixes, priorities, optional [..], aliases
    ('?start: item [SEP item] -> pair\n!item.2: "a" | "b" "b"? -> bee\nSEP.-1: "-"', "ab-"),
    # continuation lines, comments (not inside strings or regexps)
    ('start: "a"  // a comment\n    | "b/" // "c"\n\n    | "//" /c\\/?/ // end', "abc/"),
    # imports from common.lark: one, a group, one under an alias
    (
        "%import common.INT\n%import common (LETTER, WS_INLINE)\n"
        "%import common.CNAME -> NAME\nstart: INT | NAME WS_INLINE LETTER | INT NAME",
        "a1_ \tB",
    ),
    ("%import common.SIGNED_NUMBER\nstart: SIGNED_NUMBER", "1-.e"),
    ("%import common.ESCAPED_STRING\nstart: ESCAPED_STRING", 'a"\\'),
    # regexp flags: s, and none (the dot then takes no newline)
    ("start: /a.b/s", "ab\n"),
    ("start: /a.b/", "ab\n"),
    ("start: /a|b/ /[^a]/", "ab1"),
    # escapes in strings; non-ASCII
    ('start: "\\n" | "\\"" | "é" "\\\\"', '\n"é\\a'),
    # terminals of terminals, rules of rules
    ('start: A | r\nA: B "x"\nB: "b"\nr: s s\ns: "a" | A', "abx"),
    ('start: ("a" | "b")* "1"', "ab1"),
    ('start: "a" ["b" "1"]', "ab1"),
    ('start: ("ab" | "a")~1..2', "ab"),
    # ~n and [..] bound the repeats: no more than n, no more than one
    ('start: "a"~2', "a"),
    ('start: ["a"] "b"', "ab"),
    # a range of one character
    ('start: "a".."a" "b".."c"', "abcd"),
    # a comment line at the start; a rule with continuation lines before another rule
    ('// the rule\nstart: a\n    | "b"\na: "a"', "ab"),
    # a comment marker inside a string right after a character no token begins with
    ('start:"a//b"', "a/b"),
]


def texts(alphabet: str, longest: int = 4) -> list[str]:
    return ["".join(t) for n in range(longest + 1) for t in itertools.product(alphabet, repeat=n)]


def lark_parses(parser: Lark, text: str) -> bool:
    try:
        parser.parse(text)
    except LarkError:
        return False
    return True


@pytest.mark.parametrize(("definition", "alphabet"), GRAMMARS)
def test_the_language_is_larks(definition: str, alphabet: str) -> None:
    rules = parse_lark(definition)
    parser = Lark(definition, start="start", parser="earley", lexer="dynamic_complete")
    accepted = 0
    for text in texts(alphabet):
        want = lark_parses(parser, text)
        assert in_language(rules["l-start"], text, rules) == want, (definition, text)
        accepted += want
    assert accepted  # the alphabet reaches the language


def test_the_rules_are_named_for_gbnf() -> None:
    rules = parse_lark(
        "start: greeting NAME\ngreeting: /h(i|ey)/ WS_INLINE\n"
        "%import common.WS_INLINE\n%import common.CNAME -> NAME\n"
    )
    assert set(rules) == {"l-start", "l-greeting", "l-WS-INLINE", "l-NAME"}


@pytest.mark.parametrize(
    ("definition", "why"),
    [
        ("start: x\n%ignore WS", "unsupported directive %ignore"),
        ("%declare X\nstart: X", "unsupported directive %declare"),
        ("%import\nstart: x", "unsupported directive %import"),
        ("%import other.X\nstart: X", "unsupported import 'other.X'"),
        ("%import common.X -> \nstart: X", "unsupported import"),
        ("%import common.FOO\nstart: FOO", "unsupported import common.FOO"),
        ("%import common (INT, FOO)\nstart: INT", "unsupported import common.FOO"),
        ("start: missing", "undefined name 'missing'"),
        ('start: "a" (b | "c")+', "undefined name 'b'"),
        ('start: ["a" c]', "undefined name 'c'"),
        ('start = "a"', "cannot read the grammar line 'start = \"a\"'"),
        ('start: "ab".."c"', "bad range"),
        ('start: "b".."a"', "bad range"),
        ('start: "a".."bc"', "bad range"),
        ('start: "a"..x', "expected string, got 'x'"),
        ('start: ("a"', r"missing '\)'"),
        ('start: ["a")', r"missing '\]'"),
        ('start: "a" )', r"unexpected '\)'"),
        ('start: "a" -> ("b")', "bad alias"),
        ('start: "a"~x', "expected number, got 'x'"),
        ('start: "a"~1..x', "expected number, got 'x'"),
        ("start: /a/i", "unsupported regex flags 'i'"),
        ("start: /a/sm", "unsupported regex flags 'sm'"),
        ('start: "a', "unexpected '\"a'"),
        ('start: "\\x4"', "bad string"),
        ("start: /a(?=b)/", "unsupported group"),
    ],
)
def test_unsupported_or_malformed_grammars_are_refused(definition: str, why: str) -> None:
    with pytest.raises(GrammarError, match=why):
        parse_lark(definition)


@pytest.mark.parametrize(
    ("definition", "why"),
    [
        ('rule: "a"', "the grammar has no `start` rule"),
        # a line that cannot be read is quoted up to its first 60 characters
        (
            "start = " + '"a" ' * 20,
            "cannot read the grammar line " + repr("start = " + '"a" ' * 13),
        ),
        # text no token begins with is quoted up to 10 characters, in its definition
        ('start: "a" "bcdefghijklmnop', """unexpected '"bcdefghij' in '"a" "bcdefghijklmnop'"""),
        ('start: ("a"', """missing ')' in '("a"'"""),
        ('start: "a"~', """expected number, got '' in '"a"~'"""),
        ('start: "a"..', """expected string, got '' in '"a"..'"""),
    ],
)
def test_a_refusal_gives_its_whole_reason(definition: str, why: str) -> None:
    with pytest.raises(GrammarError) as refused:
        parse_lark(definition)
    assert str(refused.value) == why
