"""The regex converter's language is Python's: for every supported construct, each text of a
small alphabet (and the texts a construct is about) is in the converted grammar exactly when
`re.fullmatch` matches it (with re.ASCII: the converter's \\d \\w \\s are ASCII's); what the
converter does not support is refused, never misread."""

from __future__ import annotations

import itertools
import re

import pytest

from server.grammars.gbnf import GrammarError
from server.grammars.regex import parse_regex
from tests.support.grammar_language import in_language

ALPHABET = ("a", "b", "1", "_", " ", "\n", "-", "é")
TEXTS = ["".join(t) for n in range(4) for t in itertools.product(ALPHABET, repeat=n)]

PATTERNS = [
    # literals, escapes, the dot
    "ab",
    "aX",
    "a.b",
    r"a\.b",
    r"\n",
    r"\t\r\f\v\0\a",
    r"\x41\u00e9\U0001F600",
    r"\U0010FFFF",
    r"\-\{\}\(\)\[\]\\\|\*\+\?\^\$/",
    "é-",
    # classes
    "[ab]",
    "[^ab]",
    "[a-b1]",
    "[-a]",
    "[a-]",
    "[]a]",
    "[^]a]",
    r"[\]]",
    r"[\d_]",
    r"[\D]",
    r"[^\d]",
    r"[\w-]",
    r"[\W]",
    r"[\s]",
    r"[\S]",
    r"[\n\x41]",
    r"[a-\x62]",
    r"[\--\-]",
    r"\d\w\s",
    r"\D\W\S",
    "[é-é]",
    # groups and alternation
    "a|b",
    "a|",
    "|a",
    "(a|b)1",
    "(?:a|)b",
    "(?P<name>a)b",
    ">(?P<n>a)>",
    "(?:<a>)",
    "(a(b|1))",
    "a|b|1|_",
    # quantifiers
    "a?",
    "a*",
    "a+",
    "a{2}",
    "a{2,}",
    "a{1,2}",
    "a{0,1}b",
    "a{0}b",
    "(ab){1,2}",
    "[ab]{2,3}",
    "a*?",
    "a+?",
    "a??",
    "a{1,2}?",
    "a*+",
    "a?+",
    "(a?)*",
    "(a|b)+1?",
    "}a{2}}",
    "[a-]b",
    # anchors
    "^a$",
    "^a|^b$",
    "(^a)",
    "(a$)",
    "(^a|^b)$",
    "^$",
    "^",
]

EXTRA = ["a{2}", "a{,2}", "a{x}", "a{1,x}", "a{}", "ab-", "😀", "A", "-{}()[]\\|*+?^$/"]
EXTRA += ["A\u00e9\U0001f600", "\t\r\f\v\0\a", "]", "]a", "\\", "\U0010ffff", "}aa}"]
EXTRA += ["<a>", ">a>", "aX", "a\vb"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_language_is_pythons(pattern: str) -> None:
    for flags in (re.ASCII, re.ASCII | re.DOTALL) if "." in pattern else (re.ASCII,):
        node = parse_regex(pattern, dotall=bool(flags & re.DOTALL))
        for text in [*TEXTS, *EXTRA]:
            want = re.fullmatch(pattern, text, flags) is not None
            assert in_language(node, text) == want, (pattern, text, flags)


def test_the_dot_takes_no_newline_unless_asked() -> None:
    assert in_language(parse_regex("."), "a")
    assert not in_language(parse_regex("."), "\n")  # the default: as a tool's regex means it
    assert in_language(parse_regex(".", dotall=True), "\n")


def test_a_long_repeat_within_the_bound_is_exact() -> None:
    node = parse_regex("a{1000}")
    assert in_language(node, "a" * 1000)
    assert not in_language(node, "a" * 999)
    assert not in_language(node, "a" * 1001)
    assert in_language(parse_regex("a{1000,}"), "a" * 1001)
    assert in_language(parse_regex("a{0,1000}"), "")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?=a)b", r"unsupported group \(\?="),
        ("(?!a)", r"unsupported group \(\?!"),
        ("(?<=a)b", r"unsupported group \(\?<"),
        ("(?i)a", r"unsupported group \(\?i"),
        (r"(a)\1", r"unsupported escape \\1"),
        (r"\b", r"unsupported escape \\b"),
        (r"\X", r"unsupported escape \\X"),
        ("(?P=n)", r"unsupported group \(\?P"),
        (r"a\Z", r"unsupported escape \\Z"),
        (r"\x4", r"bad \\x escape"),
        (r"\u00e", r"bad \\u escape"),
        (r"[\x4]", r"bad \\x escape"),
        (r"\x4z", r"bad \\x escape"),
        (r"\U0011FFFF", r"\\U0011FFFF is no code point"),
        ("a^b", "anchor '\\^' inside"),
        ("X^a", "anchor '\\^' inside"),
        ("a$b", "anchor '\\$' inside"),
        ("a$X", "anchor '\\$' inside"),
        ("(a)^", "anchor '\\^' inside"),
        ("$a", "anchor '\\$' inside"),
        ("*a", "nothing to repeat at 0"),
        ("a|+", "nothing to repeat at 2"),
        ("a{2", "nothing to repeat at 1"),
        ("a{,2}", "nothing to repeat at 1"),  # Python reads {0,2}: refused, not misread
        ("a{x}", "nothing to repeat at 1"),  # Python reads a literal: refused too
        ("a{}", "nothing to repeat at 1"),
        ("(?:*)", "nothing to repeat at 3"),
        ("a)", r"unbalanced '\)' at 1"),
        ("(a", r"unexpected end of /\(a/"),
        ("(a|b", "unexpected end"),
        ("[ab", "unexpected end"),
        ("a\\", "unexpected end"),
        ("(?", "unexpected end"),
        ("[b-a]", "bad range b-a"),
        (r"[\x62-a]", "bad range b-a"),
        ("a{1001}", r"repetition \{1001\} out of range"),
        ("a{2,1}", r"repetition \{2,1\} out of range"),
        ("a{0,1001}", r"repetition \{0,1001\} out of range"),
    ],
)
def test_unsupported_or_malformed_patterns_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(GrammarError, match=why):
        parse_regex(pattern)
