"""The grammar converters: JSON schema, Lark and regex to GBNF, checked by llama.cpp itself.

`accepts` walks a text through a real llama.cpp grammar sampler token by token (the tiny GGUF's
vocabulary, loaded alone), then asks whether <|call|> may follow: what the engine would do.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.transcript import ResponseFormat, ToolGrammar, ToolSpec
from server.grammars import json_schema
from server.grammars.gbnf import GrammarError
from server.grammars.lark import parse_lark
from server.grammars.regex import parse_regex
from server.grammars.response_format import answer_grammar
from server.grammars.tools import call_grammar, custom_grammar
from server.harmony.tokens import CALL
from tests.support.tool_schemas import REGEX, STRICT_SCHEMA, VALID_TRIP, codex_apply_patch


@pytest.fixture(scope="module")
def vocab(tiny_gguf: Path) -> Iterator[Any]:
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(tiny_gguf).encode(), params)
    assert model
    yield lc.llama_model_get_vocab(model)
    lc.llama_model_free(model)


def accepts(vocab: Any, encoding: HarmonyEncoding, grammar: str, text: str) -> bool:
    sampler = lc.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, grammar
    try:
        for token in [*encoding.encode(text, allowed_special=set()), CALL]:
            data = (lc.llama_token_data * 1)(lc.llama_token_data(token, 0.0, 0.0))
            array = lc.llama_token_data_array(data, 1, -1, False)
            lc.llama_sampler_apply(sampler, ctypes.byref(array))
            if data[0].logit == -math.inf:
                return False
            if token != CALL:
                lc.llama_sampler_accept(sampler, token)
        return True
    finally:
        lc.llama_sampler_free(sampler)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


INVALID_TRIPS = [
    {**VALID_TRIP, "days": 15},
    {**VALID_TRIP, "days": 0},
    {**VALID_TRIP, "offset": -41},
    {**VALID_TRIP, "offset": 251},
    {**VALID_TRIP, "unit": "kelvin"},
    {**VALID_TRIP, "city": "x" * 13},
    {**VALID_TRIP, "tags": ["a", "b", "c", "d"]},
    {**VALID_TRIP, "where": {"lat": 1}},
    {**VALID_TRIP, "extra": 1},
    {k: v for k, v in VALID_TRIP.items() if k != "city"},
]


def test_strict_schema_grammar_accepts_exactly_valid_arguments(
    vocab: Any, encoding: HarmonyEncoding
) -> None:
    grammar = call_grammar(ToolSpec("trip", parameters=STRICT_SCHEMA, strict=True))
    assert grammar is not None
    assert accepts(vocab, encoding, grammar, _compact(VALID_TRIP))
    minimal = {k: VALID_TRIP[k] for k in ("city", "unit", "days")} | {
        "where": {"lat": 0, "precise": False}
    }
    assert accepts(vocab, encoding, grammar, _compact(minimal))
    for invalid in INVALID_TRIPS:
        assert not accepts(vocab, encoding, grammar, _compact(invalid)), invalid
    assert not accepts(vocab, encoding, grammar, _compact(VALID_TRIP)[:-1])  # not finished


def test_loose_and_argumentless_tools(vocab: Any, encoding: HarmonyEncoding) -> None:
    loose = call_grammar(ToolSpec("q", parameters={"type": "object"}, strict=False))
    assert loose is not None
    assert accepts(vocab, encoding, loose, '{"a":[1,{"b":null}],"c":"d"}')
    assert not accepts(vocab, encoding, loose, "[1]")
    assert not accepts(vocab, encoding, loose, '{"a":1}}')
    none = call_grammar(ToolSpec("ping"))
    assert none is not None
    assert accepts(vocab, encoding, none, "{}")
    assert not accepts(vocab, encoding, none, '{"a":1}')


def test_a_property_with_only_annotations_takes_any_value(
    vocab: Any, encoding: HarmonyEncoding
) -> None:
    # Claude Code's Workflow tool: `"args": {"description": "..."}`, no type
    schema = {
        "type": "object",
        "properties": {"args": {"description": "anything"}, "name": {"type": "string"}},
        "required": ["name"],
    }
    grammar = call_grammar(ToolSpec("workflow", parameters=schema, strict=True))
    assert grammar is not None
    assert json_schema.convert(schema).exact
    assert accepts(vocab, encoding, grammar, '{"args":[1,{"a":null}],"name":"x"}')
    assert accepts(vocab, encoding, grammar, '{"name":"x"}')
    assert not accepts(vocab, encoding, grammar, '{"args":1}')


@pytest.mark.parametrize(
    ("low", "high"), [(1, 14), (-40, 250), (0, 0), (-5, -3), (7, 1234), (-1000, 99), (95, 105)]
)
def test_integer_ranges_are_exact(low: int, high: int) -> None:
    expression = json_schema.int_range(low, high)
    pattern = re.compile(expression.replace('"', "").replace(" ", ""))
    for value in range(low - 120, high + 120):
        assert bool(pattern.fullmatch(str(value))) == (low <= value <= high), value
    assert not pattern.fullmatch("-0")
    assert not pattern.fullmatch("01") or low > 1


def test_unsupported_keywords_degrade_and_are_listed(caplog: pytest.LogCaptureFixture) -> None:
    schema = {
        "type": "object",
        "properties": {"ids": {"type": "array", "uniqueItems": True}, "n": {"type": "number"}},
    }
    converted = json_schema.convert(schema)
    assert not converted.exact
    assert "#/properties/ids" in converted.unsupported[0]
    with caplog.at_level(logging.INFO, logger="server.grammars.tools"):
        default = call_grammar(ToolSpec("degraded", parameters=schema))
        strict = call_grammar(ToolSpec("degraded", parameters=schema, strict=True))
    assert default == json_schema.any_object()  # not exact: strict only when asked
    assert strict == converted.gbnf
    assert sum("degraded" in r.getMessage() for r in caplog.records) == 2


def test_apply_patch_grammar_takes_patches_in_json(vocab: Any, encoding: HarmonyEncoding) -> None:
    tool = codex_apply_patch()
    spec = ToolSpec(
        "apply_patch", kind="custom", grammar=ToolGrammar("lark", tool["format"]["definition"])
    )
    grammar = call_grammar(spec)
    assert grammar is not None
    patch = '*** Begin Patch\n*** Update File: a "q".py\n@@ def f\n-\told\n+new\\n\n*** End Patch\n'
    assert accepts(vocab, encoding, grammar, _compact({"input": patch}))
    add = "*** Begin Patch\n*** Add File: x\n+one\n+two\n*** End Patch"
    assert accepts(vocab, encoding, grammar, _compact({"input": add}))
    assert not accepts(vocab, encoding, grammar, _compact({"input": "*** Begin Patch\n+x\n"}))
    assert not accepts(vocab, encoding, grammar, _compact({"input": add.replace("+one", "one")}))
    assert not accepts(vocab, encoding, grammar, json.dumps({"input": add}))  # a space after ':'


def test_regex_grammar(vocab: Any, encoding: HarmonyEncoding) -> None:
    grammar = custom_grammar("fetch", "regex", REGEX)
    assert grammar is not None
    for text in ["get a/b", 'put x_1 "hi there" \\n\n', "get z \\t"]:
        assert re.fullmatch(REGEX, text)
        assert accepts(vocab, encoding, grammar, _compact({"input": text})), text
    for text in ["got a", "get ", 'get a "no\\"quote"', "get a\n\n"]:
        assert not re.fullmatch(REGEX, text)
        assert not accepts(vocab, encoding, grammar, _compact({"input": text})), text


@pytest.mark.parametrize(
    ("syntax", "definition"),
    [
        ("regex", r"(?=a)b"),
        ("regex", r"(a)\1"),
        ("regex", "a{2"),
        ("lark", "start: x\n%ignore WS"),
        ("lark", "start: missing"),
        ("lark", "%import other.X\nstart: X"),
    ],
)
def test_unconvertible_definitions_leave_the_input_free(
    syntax: str, definition: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="server.grammars.tools"):
        assert custom_grammar(f"t-{definition}", syntax, definition) is None
    assert "free text" in caplog.text


def test_lark_features() -> None:
    rules = parse_lark(
        'start: greeting+ NAME? -> hello\n    | "x"i ("a".."c")~2..3 [INT]\n'
        "greeting: /h(i|ey)/ WS_INLINE // a comment\n"
        "%import common.INT\n%import common.WS_INLINE\n%import common.CNAME -> NAME\n"
    )
    assert set(rules) == {"l-start", "l-greeting", "l-INT", "l-WS-INLINE", "l-NAME"}
    with pytest.raises(GrammarError):
        parse_regex("a(?<=b)")


def test_server_default_enforces_schemas_of_tools_marked_not_strict() -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    exact = json_schema.convert(schema).gbnf
    assert call_grammar(ToolSpec("view_image", parameters=schema, strict=False)) == exact
    assert call_grammar(ToolSpec("view_image", parameters=schema), strict_default=False) == (
        json_schema.any_object()
    )
    assert call_grammar(ToolSpec("view_image", parameters=schema, strict=True), False) == exact


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "digit": {"type": "integer", "minimum": 1, "maximum": 9},
        "word": {"type": "string"},
    },
    "required": ["digit", "word"],
    "additionalProperties": False,
}


def test_response_format_enforces_what_tool_arguments_enforce(
    vocab: Any, encoding: HarmonyEncoding
) -> None:
    strict = answer_grammar(ResponseFormat("json_schema", schema=ANSWER_SCHEMA, strict=True))
    loose = answer_grammar(ResponseFormat("json_schema", schema=ANSWER_SCHEMA))
    as_tool = call_grammar(ToolSpec("answer", parameters=ANSWER_SCHEMA, strict=True))
    assert strict == loose == as_tool  # one schema, one grammar, wherever the client put it
    assert accepts(vocab, encoding, strict, '{"digit":9,"word":"tab\\there \\u0001"}')
    for digit in ("0", "10", "-1", "1.5"):
        assert not accepts(vocab, encoding, strict, f'{{"digit":{digit},"word":"a"}}'), digit
    for control in ("\t", "\n", "\x01", "\x1f"):  # raw, unescaped, inside the string
        assert not accepts(vocab, encoding, strict, f'{{"digit":1,"word":"a{control}b"}}')


def test_response_format_json_object_and_unsupported_schemas(
    vocab: Any, encoding: HarmonyEncoding, caplog: pytest.LogCaptureFixture
) -> None:
    any_object = answer_grammar(ResponseFormat("json_object"))
    assert accepts(vocab, encoding, any_object, '{"a":[1,{"b":null}],"c":"d"}')
    assert not accepts(vocab, encoding, any_object, "[1]")
    assert not accepts(vocab, encoding, any_object, '{"c":"a\nb"}')  # a raw newline
    schema = {**ANSWER_SCHEMA, "properties": {**ANSWER_SCHEMA["properties"], "x": {"not": {}}}}
    with pytest.raises(GrammarError, match=r"#/properties/x \(keywords \['not'\]\)"):
        answer_grammar(ResponseFormat("json_schema", schema=schema, strict=True))
    with caplog.at_level(logging.INFO, logger="server.grammars.response_format"):
        loose = answer_grammar(ResponseFormat("json_schema", schema=schema))
    assert "#/properties/x" in caplog.text
    assert accepts(vocab, encoding, loose, '{"digit":3,"word":"w","x":[true]}')
    assert not accepts(vocab, encoding, loose, '{"digit":30,"word":"w","x":1}')


def test_schemas_nested_too_deeply_are_refused_or_loosened() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(300):  # within what an HTTP body's JSON parser takes, beyond the converter
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(GrammarError, match="nested too deeply"):
        answer_grammar(ResponseFormat("json_schema", schema=deep))
    assert call_grammar(ToolSpec("deep", parameters=deep, strict=True)) == (
        json_schema.any_object()
    )
