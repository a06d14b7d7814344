"""JSON schema -> GBNF for tool arguments and response formats, honouring the schema's bounds.

Supported (enforced exactly): `type` (one or a list), `properties`, `required`,
`additionalProperties` (only the declared properties are written unless it is a schema and
there are none), `items`, `minItems` / `maxItems`, `enum`, `const` (beside `type`: only its
values of that type), `anyOf` / `oneOf` (as
alternatives), `minLength` / `maxLength`, `pattern` (the regex subset of
server.grammars.regex), integer `minimum` / `maximum` / `exclusiveMinimum` /
`exclusiveMaximum`, local `$ref` into `$defs` / `definitions`; annotations (`title`,
`description`, `default`, `format`, ...) are ignored. A subtree using any other keyword becomes
"any JSON value" and its path is listed in `unsupported`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from server.grammars import gbnf
from server.grammars.gbnf import GrammarError
from server.grammars.regex import parse_regex

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "format",
     "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict"}
)  # fmt: skip
_BY_TYPE = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "number": frozenset(),
    "boolean": frozenset(),
    "null": frozenset(),
}
_INT_LIMIT = 10**15 - 1  # integers are written with at most 15 digits
_NOTHING = '""'  # the empty alternative
_MAX_BOUND = 10_000  # larger maxLength / maxItems are treated as unbounded

PRIMITIVES = {
    "ws": '""',  # compact JSON, as gpt-oss writes arguments (and cheaper to sample)
    "value": 'object | array | string | number | "true" | "false" | "null"',
    "object": '"{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"',
    "array": '"[" ws ( value ws ( "," ws value ws )* )? "]"',
    "char": r'[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "string": r'"\"" char* "\""',
    "number": '"-"? ( "0" | [1-9] [0-9]{0,14} ) ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,2} )?',
    "integer": '"-"? ( "0" | [1-9] [0-9]{0,14} )',
    "boolean": '"true" | "false"',
    "null": '"null"',
}
_DEPENDS = {
    "value": ("object", "array", "string", "number"),
    "object": ("ws", "string", "value"),
    "array": ("ws", "value"),
    "string": ("char",),
}


@dataclass(frozen=True)
class SchemaGrammar:
    """A GBNF grammar (root rule `root`) and the schema paths it could not enforce."""

    gbnf: str
    unsupported: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.unsupported


def convert(schema: dict[str, Any]) -> SchemaGrammar:
    """The grammar of JSON text valid against `schema`."""
    builder = _Builder(schema)
    root = builder.visit(schema, "#")
    builder.rules["root"] = root
    body = "\n".join(f"{name} ::= {rule}" for name, rule in builder.rules.items())
    return SchemaGrammar(body + "\n", tuple(builder.unsupported))


def canonical(schema: object) -> str:
    """A schema as compact JSON text in its declared order (the key of the grammar caches)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def any_object() -> str:
    """The grammar of one JSON object (anything inside)."""
    builder = _Builder({})
    builder.rules["root"] = builder.primitive("object")
    return "\n".join(f"{name} ::= {rule}" for name, rule in builder.rules.items()) + "\n"


@dataclass
class _Builder:
    document: dict[str, Any]
    rules: dict[str, str] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for dependency in _DEPENDS.get(name, ()):
                self.primitive(dependency)
        return name

    def add(self, hint: str, body: str) -> str:
        name = f"r{len(self.rules)}-{hint}"
        self.rules[name] = body
        return name

    def degrade(self, path: str, why: str) -> str:
        self.unsupported.append(f"{path} ({why})")
        return self.primitive("value")

    def visit(self, schema: Any, path: str) -> str:
        if schema is True or schema == {}:
            return self.primitive("value")
        if not isinstance(schema, dict):
            return self.degrade(path, "not a schema object")
        if "$ref" in schema:
            return self._ref(schema["$ref"], path)
        keys = set(schema) - _ANNOTATIONS
        if keys & {"enum", "const", "anyOf", "oneOf"}:
            return self._choice(schema, keys, path)
        return self._by_type(schema, keys, path)

    def _choice(self, schema: dict[str, Any], keys: set[str], path: str) -> str:
        if "enum" in keys or "const" in keys:
            values = schema["enum"] if "enum" in keys else [schema["const"]]
            if not isinstance(values, list) or not values or len(keys - {"type"}) > 1:
                return self.degrade(path, "enum/const with other keywords")
            if "type" in keys:
                values = [v for v in values if _is_of_type(v, schema["type"])]
                if not values:
                    return self.degrade(path, "no enum/const value of its type")
            return "( " + " | ".join(gbnf.literal(_compact(v)) for v in values) + " )"
        for key in ("anyOf", "oneOf"):
            if key in keys:
                if keys != {key} or not isinstance(schema[key], list) or not schema[key]:
                    return self.degrade(path, f"{key} with other keywords")
                options = [self.visit(s, f"{path}/{key}/{i}") for i, s in enumerate(schema[key])]
                return "( " + " | ".join(options) + " )"
        return self.degrade(path, "unreachable")

    def _by_type(self, schema: dict[str, Any], keys: set[str], path: str) -> str:
        types = schema.get("type", _implied_type(keys))
        if types is None:
            return (
                self.degrade(path, f"keywords {sorted(keys)}") if keys else self.primitive("value")
            )
        if isinstance(types, str):
            types = [types]
        if not types or any(t not in _BY_TYPE for t in types):
            return self.degrade(path, f"type {types!r}")
        extra = keys - {"type"} - set().union(*(_BY_TYPE[t] for t in types))
        if extra:
            return self.degrade(path, f"keywords {sorted(extra)}")
        options = [self._typed(t, schema, path) for t in types]
        return options[0] if len(options) == 1 else "( " + " | ".join(options) + " )"

    def _typed(self, kind: str, schema: dict[str, Any], path: str) -> str:
        if kind == "object":
            return self._object(schema, path)
        if kind == "array":
            return self._array(schema, path)
        if kind == "string":
            return self._string(schema, path)
        if kind == "integer":
            return self._integer(schema, path)
        return self.primitive(kind)

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return self.degrade(path, "a $ref that is not local")
        if ref != "#" and not ref.startswith("#/"):
            return self.degrade(path, f"a $ref by anchor {ref}")  # `$anchor` is not read
        if ref not in self.refs:
            target: Any = self.document
            for raw in [p for p in ref[1:].split("/") if p]:
                part = raw.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    return self.degrade(path, f"unresolved $ref {ref}")
                target = target[part]
            name = self.refs[ref] = self.add("ref", "")
            self.rules[name] = self.visit(target, ref)
        return self.refs[ref]

    def _object(self, schema: dict[str, Any], path: str) -> str:
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, dict) or not isinstance(required, list):
            return self.degrade(path, "malformed properties")
        self.primitive("ws")
        if not properties and not required:
            if isinstance(extra, dict) and extra:
                value = self.visit(extra, f"{path}/additionalProperties")
                string = self.primitive("string")
                kv = f'{string} ws ":" ws {value} ws'
                return self.add("map", f'"{{" ws ( {kv} ( "," ws {kv} )* )? "}}"')
            if extra is False:
                return self.add("empty", '"{" ws "}"')
            return self.primitive("object")
        names = list(properties) + [n for n in required if n not in properties]
        members = []
        for name in names:
            value = self.visit(properties.get(name, True), f"{path}/properties/{name}")
            key = gbnf.literal(_compact(name))
            members.append((f'{key} ws ":" ws {value} ws', name in required))
        return self.add("object", f'"{{" ws {self._members(members)} "}}"')

    def _members(self, members: list[tuple[str, bool]]) -> str:
        """Members in declared order; required ones always present, commas between."""
        first = rest = ""  # rules for the members from i on, without / with a leading comma
        for kv, needed in reversed(members):
            with_first = f"{kv} {rest}".rstrip()
            with_rest = f'"," ws {kv} {rest}'.rstrip()
            if needed:
                first, rest = self.add("m", with_first), self.add("m", with_rest)
            else:
                first = self.add("m", f"( {with_first} ) | {first or _NOTHING}")
                rest = self.add("m", f"( {with_rest} ) | {rest or _NOTHING}")
        return first

    def _array(self, schema: dict[str, Any], path: str) -> str:
        item = self.visit(schema.get("items", True), f"{path}/items")
        low, high = _bounds(schema, "minItems", "maxItems")
        if low is None:
            return self.degrade(path, "bad minItems/maxItems")
        self.primitive("ws")
        more = f'"," ws {item} ws'
        if high is None:
            tail = f"( {more} )*" if low == 0 else f"( {more} ){{{low - 1},}}"
        elif high <= 1:
            tail = ""
        else:
            tail = f"( {more} ){{{max(low - 1, 0)},{high - 1}}}"
        inner = f"{item} ws {tail}"
        body = inner if low > 0 else f"( {inner} )?" if high != 0 else ""
        return self.add("array", f'"[" ws {body} "]"')

    def _string(self, schema: dict[str, Any], path: str) -> str:
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                return self.degrade(path, "pattern with a length")
            return self._pattern(schema["pattern"], path)
        low, high = _bounds(schema, "minLength", "maxLength")
        if low is None:
            return self.degrade(path, "bad minLength/maxLength")
        if low == 0 and high is None:
            return self.primitive("string")
        char = self.primitive("char")
        count = f"{{{low},}}" if high is None else f"{{{low},{high}}}"
        return self.add("string", f'"\\"" {char}{count} "\\""')

    def _pattern(self, pattern: Any, path: str) -> str:
        if not isinstance(pattern, str):
            return self.degrade(path, "bad pattern")
        try:
            node = parse_regex(pattern.removeprefix("^").removesuffix("$"))
        except GrammarError as exc:
            return self.degrade(path, f"pattern: {exc}")
        anything = gbnf.Repeat(gbnf.Chars((), negated=True), 0, None)
        items: list[gbnf.Node] = [anything] if not pattern.startswith("^") else []
        items.append(node)
        if not pattern.endswith("$"):
            items.append(anything)
        body = gbnf.expression(gbnf.Seq(tuple(items)), escaped=True)
        return self.add("pattern", f'"\\"" {body} "\\""')

    def _integer(self, schema: dict[str, Any], path: str) -> str:
        try:
            low, high = _int_bounds(schema)
        except (TypeError, ValueError, OverflowError):
            return self.degrade(path, "bad integer bounds")
        if low is None and high is None:
            return self.primitive("integer")
        low = -_INT_LIMIT if low is None else max(low, -_INT_LIMIT)
        high = _INT_LIMIT if high is None else min(high, _INT_LIMIT)
        if low > high:
            return self.degrade(path, "an empty integer range")
        return self.add("int", int_range(low, high))


def _implied_type(keys: set[str]) -> str | None:
    for kind in ("object", "array", "string", "integer"):
        if keys & _BY_TYPE[kind]:
            return kind
    return None


def _is_of_type(value: Any, types: Any) -> bool:
    """Whether a JSON value is of `type` (a name or a list of names), as JSON schema reads it."""
    names = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    number = isinstance(value, int | float) and not isinstance(value, bool)
    checks = {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "integer": number and (isinstance(value, int) or float(value).is_integer()),
        "number": number,
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }
    return any(isinstance(name, str) and checks.get(name, False) for name in names)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _bounds(schema: dict[str, Any], low_key: str, high_key: str) -> tuple[int | None, int | None]:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    if not isinstance(low, int) or low < 0 or low > _MAX_BOUND:
        return None, None
    if high is not None and (not isinstance(high, int) or high < low):
        return None, None
    return low, (None if high is None or high > _MAX_BOUND else high)


def _int_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    low: int | None = None
    high: int | None = None
    if "minimum" in schema:
        low = math.ceil(float(schema["minimum"]))
    if "exclusiveMinimum" in schema:
        low = max(low if low is not None else -_INT_LIMIT,
                  math.floor(float(schema["exclusiveMinimum"])) + 1)  # fmt: skip
    if "maximum" in schema:
        high = math.floor(float(schema["maximum"]))
    if "exclusiveMaximum" in schema:
        high = min(high if high is not None else _INT_LIMIT,
                   math.ceil(float(schema["exclusiveMaximum"])) - 1)  # fmt: skip
    return low, high


def int_range(low: int, high: int) -> str:
    """A GBNF expression for the decimal integers low..high (no leading zeros, no `-0`)."""
    options = []
    if low < 0:
        options += ['"-" ' + p for p in _digit_patterns(max(1, -high), -low)]
    if high >= 0:
        options += _digit_patterns(max(0, low), high)
    return "( " + " | ".join(options) + " )"


def _digit_patterns(low: int, high: int) -> list[str]:
    patterns = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        start = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        end = min(high, 10**digits - 1)
        if start <= end:
            sequences = _same(str(start), str(end))
            patterns += [" ".join(_digit(a, b) for a, b in seq) for seq in sequences]
    return patterns


def _digit(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _same(low: str, high: str) -> list[list[tuple[int, int]]]:
    """Digit-range sequences covering low..high (strings of equal length)."""
    if not low:
        return [[]]
    a, b, n = int(low[0]), int(high[0]), len(low) - 1
    if a == b:
        return [[(a, a), *p] for p in _same(low[1:], high[1:])]
    if low[1:] == "0" * n and high[1:] == "9" * n:
        return [[(a, b)] + [(0, 9)] * n]
    out = [[(a, a), *p] for p in _same(low[1:], "9" * n)]
    if a + 1 <= b - 1:
        out.append([(a + 1, b - 1)] + [(0, 9)] * n)
    out += [[(b, b), *p] for p in _same("0" * n, high[1:])]
    return out
