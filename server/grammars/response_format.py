"""Response format: the grammar a final answer is sampled under (`response_format`, `text.format`).

`json_object` is any JSON object; `json_schema` is JSON valid against its schema, converted by
server.grammars.json_schema, the converter tool arguments use: one schema is enforced the same
way wherever the client put it (integer bounds, lengths, patterns, strings without raw control
characters). A strict format whose schema uses what the converter cannot enforce is refused
(GrammarError naming the parts, a 400 to the client); a non-strict one is enforced where it can
be and the rest is sampled as any JSON value. Conversions are cached per distinct schema.
"""

from __future__ import annotations

import functools
import json
import logging

from server.contracts.transcript import ResponseFormat
from server.grammars import json_schema
from server.grammars.gbnf import GrammarError

log = logging.getLogger(__name__)


def answer_grammar(response_format: ResponseFormat) -> str:
    """The GBNF grammar (root rule `root`) of the final answer; GrammarError when refused."""
    if response_format.kind == "json_object" or response_format.schema is None:
        return json_schema.any_object()
    try:
        return schema_grammar(json_schema.canonical(response_format.schema), response_format.strict)
    except RecursionError as exc:
        raise GrammarError("the schema is nested too deeply") from exc


@functools.lru_cache(maxsize=256)
def schema_grammar(schema_json: str, strict: bool) -> str:
    """Cached per (schema as sent, strictness)."""
    converted = json_schema.convert(json.loads(schema_json))
    if converted.exact:
        return converted.gbnf
    unsupported = "; ".join(converted.unsupported)
    if strict:
        raise GrammarError(
            f"{unsupported} (a strict schema is enforced whole or refused; without `strict` the "
            "rest is enforced and these parts are any JSON value)"
        )
    log.info("response format: these parts are sampled as any JSON value: %s", unsupported)
    return converted.gbnf
