"""The JSON schema converter's language is the `jsonschema` library's: for schemas that use each
supported keyword, every candidate value (valid ones and near misses, made from the schema)
written as compact JSON is in the converted grammar exactly when jsonschema validates it, and
for scalar schemas every short text of a small alphabet is in it exactly when it is compact JSON
that validates. The grammar is read back from its GBNF text (tests/support/gbnf_text.py); no
llama.cpp.

jsonschema checks the schema as the converter documents it enforces it:
- an object with `properties` or `required` takes only those members (`additionalProperties`
  false), in declared order (candidates are written so); a required name without a property
  schema takes any value;
- `oneOf` is read as `anyOf` (its options are alternatives);
- a schema without `type` whose keywords all belong to one type is of that type;
- a `maxLength` / `maxItems` above 10000 bounds nothing;
- annotations (`format`, `title`, ...) constrain nothing;
- an integer has at most 15 digits and is written without a fraction or an exponent;
- a pattern's `$` ends the text (ECMA-262's reading; Python's `$` also lets a final newline
  follow).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from server.grammars import json_schema
from tests.support.gbnf_text import parse_gbnf
from tests.support.grammar_language import in_language
from tests.support.tool_schemas import STRICT_SCHEMA, VALID_TRIP

_INT_LIMIT = 10**15 - 1

_BY_TYPE = {  # the keywords that imply a type, in the order the converter tries them
    "object": ("properties", "required", "additionalProperties"),
    "array": ("items", "minItems", "maxItems"),
    "string": ("minLength", "maxLength", "pattern"),
    "integer": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
}


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def language(schema: Any) -> Callable[[str], bool]:
    """Whether a text is in the grammar converted from `schema`."""
    converted = json_schema.convert(schema)
    rules = parse_gbnf(converted.gbnf)
    return lambda text: in_language(rules["root"], text, rules)


def as_enforced(schema: Any) -> Any:
    """`schema` as the converter documents it enforces it (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    out = {key: _enforced_child(key, value) for key, value in schema.items()}
    if "oneOf" in out:
        out["anyOf"] = out.pop("oneOf")
    if "type" not in out and not {"enum", "const", "anyOf", "$ref"} & set(out):
        for kind, keys in _BY_TYPE.items():
            if set(keys) & set(out):
                out["type"] = kind
                break
    if "properties" in out or "required" in out:
        properties = dict(out.get("properties") or {})
        for name in out.get("required") or []:
            properties.setdefault(name, {})
        out["properties"] = properties
        out["additionalProperties"] = False
    for key in ("maxLength", "maxItems"):
        if isinstance(out.get(key), int) and out[key] > 10_000:
            del out[key]
    out.pop("format", None)
    if isinstance(out.get("pattern"), str) and out["pattern"].endswith("$"):
        out["pattern"] = out["pattern"][:-1] + "\\Z"
    kinds = out.get("type")
    integer = kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds)
    if integer and not {"enum", "const"} & set(out):
        out = {"allOf": [out, {"minimum": -_INT_LIMIT, "maximum": _INT_LIMIT}]}
    return out


def _enforced_child(key: str, value: Any) -> Any:
    if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
        return {name: as_enforced(child) for name, child in value.items()}
    if key in ("anyOf", "oneOf") and isinstance(value, list):
        return [as_enforced(child) for child in value]
    if key in ("items", "additionalProperties"):
        return as_enforced(value)
    return value


POOL: list[Any] = [None, True, False, 0, -7, 12, 2.5, -0.125, 1.5e20, "", "x", "7", [], [0], {}]
POOL += [{"k": 1}, [None, "a"], {"a": {"b": []}}]
STRING_CHARS = ("a", "Z", " ", '"', "\\", "\n", "\t", "\x01", "\x7f", "é", "😀", "/")


def candidates(schema: Any, document: Any, depth: int = 0) -> list[Any]:
    """Values to try against `schema`: valid ones and near misses, then the general pool."""
    found = _made(schema, document, depth) + (POOL if depth < 2 else POOL[:8])
    unique: list[Any] = []
    seen: set[str] = set()
    for value in found:
        key = compact(value) + type(value).__name__
        if key not in seen:
            seen.add(key)
            unique.append(value)
    return unique


def _made(schema: Any, document: Any, depth: int) -> list[Any]:
    if not isinstance(schema, dict) or depth > 3:
        return []
    if "$ref" in schema:
        target = document
        for part in schema["$ref"][1:].split("/"):
            if part:
                target = target[part.replace("~1", "/").replace("~0", "~")]
        return _made(target, document, depth + 1)
    if "enum" in schema:
        return [*schema["enum"], "other", 99]
    if "const" in schema:
        return [schema["const"], "other", 99]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [v for option in schema[key] for v in _made(option, document, depth)]
    kinds = schema.get("type")
    if kinds is None:
        kinds = next((k for k, keys in _BY_TYPE.items() if set(keys) & set(schema)), None)
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    out: list[Any] = []
    for kind in kinds:
        out += _made_of(kind, schema, document, depth)
    return out


def _made_of(  # noqa: PLR0911 (one return a type)
    kind: str, schema: dict[str, Any], document: Any, depth: int
) -> list[Any]:
    if kind == "object":
        return _objects(schema, document, depth)
    if kind == "array":
        items = candidates(schema.get("items", True), document, depth + 1)[:12]
        low, high = schema.get("minItems", 0), schema.get("maxItems", 4)
        high = min(high, low + 4)
        arrays = []
        for n in range(max(0, low - 1), high + 2):
            arrays += [[items[(i + s) % len(items)] for i in range(n)] for s in range(len(items))]
        return arrays
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", 4)
        high = min(high, low + 4)
        lengths = range(max(0, low - 1), high + 2)
        chars = STRING_CHARS
        return [
            "".join(chars[(i + s) % len(chars)] for i in range(n))
            for n in lengths
            for s in range(len(chars))
        ]
    if kind == "integer":
        edges = [0, 1, -1, 10**15 - 1, -(10**15) + 1, 10**15, 99, 100, -100, 1.5]
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in schema:
                edge = int(schema[key])
                edges += range(edge - 12, edge + 13)
        return edges
    if kind == "number":
        return [0, 3, -3, 0.5, -2.75, 1e-07, 1.25e14, 10**15 - 1]
    if kind == "boolean":
        return [True, False]
    return [None]


def _objects(schema: dict[str, Any], document: Any, depth: int) -> list[Any]:
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    names = list(properties) + [n for n in required if n not in properties]
    extra = schema.get("additionalProperties", True)
    if not names:
        values = candidates(extra if isinstance(extra, dict) else True, document, depth + 1)
        keys = ["a", "b", 'q"', ""]
        return [
            dict(zip(keys[: n % 4], values[i:], strict=False))
            for i in range(len(values))
            for n in range(4)
        ]
    choices = {n: candidates(properties.get(n, True), document, depth + 1) for n in names}
    base = {n: _first_valid(properties.get(n, True), choices[n], document) for n in names}
    out: list[Any] = []
    for size in range(len(names) + 1):  # every subset of members, in declared order
        for subset in itertools.combinations(names, size):
            out.append({n: base[n] for n in subset})
    for n in names:  # each member's every candidate, the others valid
        for value in choices[n]:
            out.append({m: (value if m == n else base[m]) for m in names})
    full = {n: base[n] for n in names}
    out.append({**full, "zz": 1})  # a member not declared
    out.append({"zz": 1, **full})
    return out


def _first_valid(schema: Any, values: list[Any], document: Any) -> Any:
    validator = _validator(schema, document)
    return next((v for v in values if validator.is_valid(v)), None)


def _validator(schema: Any, document: Any) -> Any:
    """A validator of `schema`, a part of `document` (whose definitions it may refer to)."""
    enforced = as_enforced(schema)
    if schema is not document and isinstance(enforced, dict):
        for key in ("$defs", "definitions"):
            if isinstance(document, dict) and key in document:
                enforced = {key: as_enforced(document)[key], **enforced}
    return jsonschema.Draft202012Validator(enforced)


def check(schema: dict[str, Any], extra: tuple[Any, ...] = (), texts: tuple[str, ...] = ()) -> int:
    """Every candidate value, written compact, is in the grammar exactly when jsonschema
    validates it; so is each of `texts` exactly when it is JSON that validates. Returns how
    many were tried."""
    converted = json_schema.convert(schema)
    assert converted.exact, converted.unsupported
    accepts = language(schema)
    validator = _validator(schema, schema)
    tried = 0
    for value in [*candidates(schema, schema), *extra]:
        want = validator.is_valid(value)
        assert accepts(compact(value)) == want, (compact(value), want)
        tried += 1
    for text in texts:
        assert accepts(text) == _text_valid(text, validator), text
        tried += 1
    return tried


def _text_valid(text: str, validator: Any) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return bool(validator.is_valid(value))


def texts(alphabet: tuple[str, ...] | str, longest: int) -> tuple[str, ...]:
    """Every text of up to `longest` pieces of `alphabet`."""
    return tuple(
        "".join(t) for n in range(longest + 1) for t in itertools.product(alphabet, repeat=n)
    )


ESCAPES = ('"\\u0041"', '"\\u00e9x"', '"\\/"', '"\\x"', '"\\u00G0"', '"\\b\\f\\r\\t"', '"\\"')


OBJECTS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    {
        "type": "object",
        "properties": {
            "a": {"type": "boolean"},
            "b": {"type": "null"},
            "c": {"type": "integer", "maximum": 3},
            "d": {"type": "string", "maxLength": 1},
        },
        "required": ["b", "d"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
        "required": ["a", "b"],
    },
    {"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a", "z"]},
    {"type": "object", "required": ["z"]},
    {"type": "object", "properties": {'q"\\/é': {"const": 1}, "": {"type": "null"}}},
    {"type": "object", "additionalProperties": False},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 3}},
    {
        "type": "object",
        "additionalProperties": {"type": "null"},
        "properties": {"a": {"type": "boolean"}},
    },
    {"type": "object", "additionalProperties": True},
    {"type": "object", "additionalProperties": {}},
    {"type": "object"},
    {"properties": {"a": {"type": "boolean"}}, "required": ["a"]},  # the type implied
    {
        "type": "object",
        "properties": {
            "o": {"type": "object", "properties": {"p": {"type": "null"}}, "required": ["p"]}
        },
    },
]
ARRAYS = [
    {"type": "array"},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3}},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
    {"type": "array", "items": {"type": "null"}, "minItems": 3},
    {"type": "array", "items": {"type": "null"}, "maxItems": 0},
    {"type": "array", "items": {"type": "null"}, "maxItems": 1},
    {"type": "array", "items": {"type": "null"}, "minItems": 1, "maxItems": 1},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 0, "maxItems": 2},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4},
    {"type": "array", "maxItems": 20_000},
    {"maxItems": 2},  # the type implied
    {
        "type": "array",
        "items": {"type": "array", "items": {"type": "null"}, "maxItems": 1},
        "minItems": 1,
    },
]
STRINGS = [
    {"type": "string"},
    {"type": "string", "minLength": 2},
    {"type": "string", "maxLength": 3},
    {"type": "string", "minLength": 1, "maxLength": 2},
    {"type": "string", "minLength": 0, "maxLength": 0},
    {"type": "string", "minLength": 3, "maxLength": 3},
    {"type": "string", "maxLength": 10_001},
    {"type": "string", "maxLength": 10_000},
    {"minLength": 1},  # the type implied
    {"type": "string", "format": "date-time", "title": "t", "description": "d", "default": "x"},
]
SCALARS = [
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "integer", "minimum": -12, "maximum": 105},
    {"type": "integer", "minimum": 3},
    {"type": "integer", "maximum": -3},
    {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 9},
    {"type": "integer", "exclusiveMinimum": -1.5, "exclusiveMaximum": 2.5},
    {"type": "integer", "minimum": 1.5, "maximum": 4.5},
    {"type": "integer", "minimum": 0, "exclusiveMinimum": 3, "maximum": 9, "exclusiveMaximum": 6},
    {"type": "integer", "minimum": 5, "exclusiveMinimum": 3, "maximum": 5, "exclusiveMaximum": 8},
    {"type": "integer", "minimum": -(10**20), "maximum": 10**20},
    {"type": "integer", "exclusiveMaximum": 0},
    {"type": "integer", "exclusiveMinimum": 0},
    {"maximum": 7},  # the type implied
    {"type": ["string", "null"], "maxLength": 1},
    {"type": ["integer", "boolean"], "minimum": 2},
    {"type": ["array", "object"]},
    {"type": "integer", "minimum": 7, "maximum": 7},
]
CHOICES = [
    {"enum": ["a", 1, None, True, {"x": [1]}, [1, "b"], 'q"\n']},
    {"const": "c"},
    {"const": {"a": [1, None]}},
    {"type": "string", "enum": ["a", "b"]},
    {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 5}]},
    {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]},
    {"anyOf": [{"type": "null"}, {"type": "array", "items": {"const": 1}, "maxItems": 2}]},
    {"type": "object", "properties": {"x": {"oneOf": [{"type": "boolean"}, {"const": "y"}]}}},
]
REFS = [
    {
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["kids"],
    },
    {
        "$defs": {"n": {"type": "integer", "maximum": 2}},
        "type": "array",
        "items": {"$ref": "#/$defs/n"},
    },
    {
        "definitions": {"n": {"type": "string", "maxLength": 1}},
        "type": "object",
        "properties": {"a": {"$ref": "#/definitions/n"}, "b": {"$ref": "#/definitions/n"}},
    },
    {
        "$defs": {"a/b": {"const": 3}, "c~d": {"const": 4}},
        "anyOf": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}],
    },
    {
        "$defs": {
            "tree": {
                "type": "object",
                "properties": {
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2}
                },
                "required": ["kids"],
            }
        },
        "$ref": "#/$defs/tree",
    },
]
PATTERNS = [
    {"type": "string", "pattern": "^[a-c]+$"},
    {"type": "string", "pattern": "b"},
    {"type": "string", "pattern": "^a"},
    {"type": "string", "pattern": "a$"},
    {"type": "string", "pattern": "^\\d{2}$"},
    {"type": "string", "pattern": '^[\\\\"\\n]?x$'},
    {"pattern": "^(ab|c)?$"},  # the type implied
]


@pytest.mark.parametrize("schema", OBJECTS, ids=compact)
def test_objects(schema: dict[str, Any]) -> None:
    assert check(schema) > 20


@pytest.mark.parametrize("schema", ARRAYS, ids=compact)
def test_arrays(schema: dict[str, Any]) -> None:
    check(
        schema,
        texts=texts(("[", "]", ",", "null"), 5)
        if "items" in schema and schema["items"] == {"type": "null"}
        else (),
    )


@pytest.mark.parametrize("schema", STRINGS, ids=compact)
def test_strings(schema: dict[str, Any]) -> None:
    long = ("x" * 10_000, "x" * 10_001, "x" * 10_002) if schema.get("maxLength", 0) > 9 else ()
    check(schema, extra=long, texts=texts('"a\\n', 5) + ESCAPES)


@pytest.mark.parametrize("schema", SCALARS, ids=compact)
def test_scalars(schema: dict[str, Any]) -> None:
    number = "number" in str(schema.get("type"))
    written = texts("-0179." if number else "-0179", 4)
    written += texts(("1", "0", "null", "true", *("eE-+" if number else "")), 3)
    # "-0": JSON, and the plain integer rule takes it; a bounded range writes 0 only
    check(schema, texts=tuple(t for t in written if t != "-0"))


@pytest.mark.parametrize("schema", CHOICES, ids=compact)
def test_choices(schema: dict[str, Any]) -> None:
    check(schema)


@pytest.mark.parametrize("schema", REFS, ids=compact)
def test_refs(schema: dict[str, Any]) -> None:
    check(schema)


@pytest.mark.parametrize("schema", PATTERNS, ids=compact)
def test_patterns(schema: dict[str, Any]) -> None:
    check(schema, texts=(*texts('"abc1\\', 4), '"abcab"', '"1abab"', '"\\n"'))


def test_a_nested_tool_schema() -> None:
    trip = dict(VALID_TRIP)
    assert check(STRICT_SCHEMA, extra=(trip, {**trip, "days": 15}, {**trip, "extra": 1})) > 100


def test_an_enum_under_a_type_takes_only_the_values_of_that_type() -> None:
    check({"type": "string", "enum": ["a", 1, None]})
    check({"type": ["integer", "null"], "enum": ["a", 1, None, True, 1.5, 2.0, 10**400]})
    check({"type": "number", "const": 2})
    check({"type": "boolean", "enum": [True, 1, "true"]})
    check({"type": "array", "enum": [[1], {"a": 1}, "x"]})
    check({"type": "object", "enum": [{"a": 1}, [1], None]})


def test_members_come_in_declared_order_and_compact() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"}},
        "required": ["a"],
    }
    accepts = language(schema)
    assert accepts('{"a":null,"c":null}')
    assert accepts('{"a":null,"b":null,"c":null}')
    for text in ('{"c":null,"a":null}', '{"a":null,"c":null,"b":null}', '{"b":null,"a":null}'):
        assert not accepts(text), text
    for text in ('{"a": null}', '{ "a":null}', '{"a":null }', '{"a" :null}', "[ ]", '{"a":null,}'):
        assert not accepts(text), text
    assert not language({"type": "array"})("[ ]")
    assert not accepts('{"a":null,"a":null}')


def test_any_object_and_canonical() -> None:
    rules = parse_gbnf(json_schema.any_object())
    for value in POOL:
        text = compact(value)
        assert in_language(rules["root"], text, rules) == isinstance(value, dict), text
    assert in_language(rules["root"], '{"a":[1,{"b":"c\\u0041"}],"a":-0.5e+10}', rules)
    assert not in_language(rules["root"], '{"a":01}', rules)
    assert json_schema.canonical({"b": [1, "é"], "a": None}) == '{"b":[1,"é"],"a":null}'
    assert json_schema.convert({}).exact
    assert json_schema.convert({"title": "anything"}).exact


@pytest.mark.parametrize(
    ("low", "high"),
    [(0, 0), (0, 9), (1, 14), (-40, 250), (-5, -3), (7, 1234), (-1000, 99), (95, 105), (10, 99)],
)
def test_integer_ranges_are_exact(low: int, high: int) -> None:
    rules = parse_gbnf(f"root ::= {json_schema.int_range(low, high)}\n")
    for value in range(low - 130, high + 130):
        assert in_language(rules["root"], str(value), rules) == (low <= value <= high), value
    for text in ("-0", "00", "01", "-01", "+1", ""):
        assert not in_language(rules["root"], text, rules), text


ANY = {"anything": "goes"}


@pytest.mark.parametrize(
    ("part", "why"),
    [
        ({"allOf": [{"type": "string"}]}, "keywords ['allOf']"),
        ({"not": {}}, "keywords ['not']"),
        ({"type": "string", "nullable": True}, "keywords ['nullable']"),
        ({"type": "number", "minimum": 1}, "keywords ['minimum']"),
        ({"type": "array", "uniqueItems": True}, "keywords ['uniqueItems']"),
        ({"type": "array", "prefixItems": [{}]}, "keywords ['prefixItems']"),
        ({"type": "string", "pattern": "a", "maxLength": 2}, "pattern with a length"),
        ({"type": "string", "pattern": "a", "minLength": 2}, "pattern with a length"),
        ({"type": "string", "pattern": "(?=a)"}, "pattern: unsupported group (?= in /(?=a)/"),
        ({"type": "string", "pattern": 3}, "bad pattern"),
        ({"enum": ["a"], "minLength": 1}, "enum/const with other keywords"),
        ({"const": "a", "enum": ["a"]}, "enum/const with other keywords"),
        ({"enum": []}, "enum/const with other keywords"),
        ({"enum": "a"}, "enum/const with other keywords"),
        ({"type": "string", "enum": [1, None]}, "no enum/const value of its type"),
        ({"type": "date", "enum": ["a"]}, "no enum/const value of its type"),
        ({"type": [["string"]], "const": "a"}, "no enum/const value of its type"),
        ({"type": 3, "const": "a"}, "no enum/const value of its type"),
        ({"type": {"string": 1}, "enum": ["a"]}, "no enum/const value of its type"),
        ({"anyOf": [{}], "type": "string"}, "anyOf with other keywords"),
        ({"oneOf": [{}], "title": "t", "x-y": 1}, "oneOf with other keywords"),
        ({"anyOf": []}, "anyOf with other keywords"),
        ({"oneOf": {"type": "null"}}, "oneOf with other keywords"),
        ({"$ref": "https://example.com/s.json"}, "a $ref that is not local"),
        ({"$ref": 3}, "a $ref that is not local"),
        ({"$ref": "#y"}, "a $ref by anchor #y"),  # not the pointer #/y
        ({"$ref": "#/$defs/missing"}, "unresolved $ref #/$defs/missing"),
        ({"$ref": "#/properties/x/type/deeper"}, "unresolved $ref #/properties/x/type/deeper"),
        (3, "not a schema object"),
        ([], "not a schema object"),
        ({"type": "date"}, "type ['date']"),
        ({"type": []}, "type []"),
        ({"type": ["string", "float"]}, "type ['string', 'float']"),
        ({"x-extension": 1}, "keywords ['x-extension']"),
        ({"type": "array", "minItems": -1}, "bad minItems/maxItems"),
        ({"type": "array", "minItems": "2"}, "bad minItems/maxItems"),
        ({"type": "array", "minItems": 10_001}, "bad minItems/maxItems"),
        ({"type": "array", "minItems": 3, "maxItems": 2}, "bad minItems/maxItems"),
        ({"type": "array", "maxItems": 2.5}, "bad minItems/maxItems"),
        ({"type": "string", "minLength": 2, "maxLength": 1}, "bad minLength/maxLength"),
        ({"type": "string", "maxLength": "1"}, "bad minLength/maxLength"),
        ({"type": "integer", "minimum": "x"}, "bad integer bounds"),
        ({"type": "integer", "maximum": [1]}, "bad integer bounds"),
        ({"type": "integer", "exclusiveMinimum": float("inf")}, "bad integer bounds"),
        ({"type": "integer", "exclusiveMaximum": "nan"}, "bad integer bounds"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "an empty integer range"),
        ({"type": "integer", "minimum": 4.2, "maximum": 4.8}, "an empty integer range"),
        (
            {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5},
            "an empty integer range",
        ),
        ({"type": "integer", "minimum": 10**15}, "an empty integer range"),
        ({"type": "integer", "maximum": -(10**15)}, "an empty integer range"),
        ({"type": "object", "properties": [1]}, "malformed properties"),
        ({"type": "object", "required": "a"}, "malformed properties"),
    ],
)
def test_what_is_not_enforced_is_listed_and_takes_any_value(part: Any, why: str) -> None:
    schema = {"type": "object", "properties": {"x": part, "y": {"type": "null"}}, "required": ["x"]}
    converted = json_schema.convert(schema)
    assert converted.unsupported == (f"#/properties/x ({why})",)
    assert not converted.exact
    accepts = language(schema)
    for value in POOL:
        assert accepts(compact({"x": value})), value
        assert accepts(compact({"x": value, "y": None})), value
        assert not accepts(compact({"x": value, "y": 1})), value
    assert not accepts(compact({"y": None}))


def test_unsupported_parts_are_listed_by_path() -> None:
    schema = {
        "$defs": {"d": {"not": {}}},
        "type": "array",
        "items": {
            "anyOf": [
                {"$ref": "#/$defs/d"},
                {"type": "object", "additionalProperties": {"allOf": []}},
                {"type": "array", "items": {"type": "number", "maximum": 1}},
            ]
        },
    }
    assert json_schema.convert(schema).unsupported == (
        "#/$defs/d (keywords ['not'])",
        "#/items/anyOf/1/additionalProperties (keywords ['allOf'])",
        "#/items/anyOf/2/items (keywords ['maximum'])",
    )
    once = {"$defs": {"d": {"not": {}}}, "anyOf": [{"$ref": "#/$defs/d"}, {"$ref": "#/$defs/d"}]}
    assert json_schema.convert(once).unsupported == ("#/$defs/d (keywords ['not'])",)
    assert json_schema.convert({"allOf": []}).unsupported == ("# (keywords ['allOf'])",)


def test_the_largest_enforced_bounds() -> None:
    assert check(
        {"type": "array", "items": {"const": 0}, "minItems": 10_000},
        extra=([0] * 10_000, [0] * 9_999),
    )
    check(
        {"type": "array", "items": {"const": 0}, "maxItems": 10_000},
        extra=([0] * 10_000, [0] * 10_001),
    )
    check({"type": "array", "items": {"const": 0}, "maxItems": 10_001}, extra=([0] * 10_002,))
    check({"type": "string", "minLength": 10_000}, extra=("x" * 10_000, "x" * 9_999))
