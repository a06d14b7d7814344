"""The grammar a tool call's message content is sampled under (None: sampled freely).

A function tool's arguments are one JSON object: valid against `parameters` when the tool says
`strict: true`, or when the server's default (--strict-tools, on) applies and the converter
supports the schema fully; any object otherwise. A custom tool's input is written as
`{"input":"..."}` (see the Responses adapter), so its Lark or regex language is wrapped in that
JSON string, escaped.
Conversions are cached per distinct definition, and each problem is logged once per tool.
"""

from __future__ import annotations

import functools
import json
import logging

from server.contracts.transcript import ToolSpec
from server.grammars import gbnf, json_schema
from server.grammars.gbnf import GrammarError
from server.grammars.lark import PREFIX, START, parse_lark
from server.grammars.regex import parse_regex

log = logging.getLogger(__name__)

_NO_ARGUMENTS = '{"type":"object","properties":{},"additionalProperties":false}'
_CUSTOM_OPEN = '{"input":"'
_CUSTOM_CLOSE = '"}'


def call_grammar(spec: ToolSpec, strict_default: bool = True) -> str | None:
    """The GBNF grammar (root rule `root`) of a call's content for this tool."""
    if spec.kind == "custom":
        if spec.grammar is None:
            return None
        return custom_grammar(spec.name, spec.grammar.syntax, spec.grammar.definition)
    schema = _NO_ARGUMENTS if spec.parameters is None else json_schema.canonical(spec.parameters)
    return function_grammar(spec.name, schema, spec.strict, strict_default)


@functools.lru_cache(maxsize=512)
def function_grammar(name: str, schema_json: str, strict: bool | None, default: bool) -> str:
    """Cached per (tool name, schema as sent, strictness, server default).

    The schema is enforced when the tool is strict, or when the server's default is on and the
    schema can be enforced exactly: a tool marked `strict: false` (Codex marks all of its
    tools so) still gets arguments its client can deserialize.
    """
    schema = json.loads(schema_json)
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        log.warning("tool %s: its parameters are not an object schema; any object is allowed",
                    name)  # fmt: skip
        return json_schema.any_object()
    if strict is not True and not default:
        return json_schema.any_object()
    try:
        converted = json_schema.convert(schema)
    except RecursionError:
        log.warning("tool %s: its parameters are nested too deeply; any object is allowed", name)
        return json_schema.any_object()
    if converted.exact:
        return converted.gbnf
    unsupported = "; ".join(converted.unsupported)
    if strict is not True:
        log.info("tool %s: arguments are any JSON object (schema not fully enforceable: %s)",
                 name, unsupported)  # fmt: skip
        return json_schema.any_object()
    log.warning("tool %s: strict, but these parts are sampled as any JSON value: %s",
                name, unsupported)  # fmt: skip
    return converted.gbnf


@functools.lru_cache(maxsize=256)
def custom_grammar(name: str, syntax: str, definition: str) -> str | None:
    """A custom tool's `{"input":"..."}` grammar; None (free text) when it cannot be converted."""
    try:
        if syntax == "lark":
            rules = parse_lark(definition)
            start = PREFIX + START
        elif syntax == "regex":
            rules = {"x-start": parse_regex(definition)}
            start = "x-start"
        else:
            raise GrammarError(f"unknown syntax {syntax!r}")
        body = gbnf.write(rules, start, escaped=True)
    except (GrammarError, RecursionError) as exc:
        log.warning("tool %s: its %s grammar cannot be enforced, input is free text: %s",
                    name, syntax, exc)  # fmt: skip
        return None
    root = f"root ::= {gbnf.literal(_CUSTOM_OPEN)} {start} {gbnf.literal(_CUSTOM_CLOSE)}\n"
    return root + body
