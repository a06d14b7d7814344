"""GBNF grammars for structured output, from llama-cpp-python's JSON-schema converter."""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf


def json_grammar(schema: dict[str, Any] | None) -> str:
    """A grammar for any JSON object (schema None) or for JSON valid against `schema`.

    Raises ValueError when the schema cannot be converted.
    """
    if schema is None:
        return str(JSON_GBNF)
    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except (KeyError, TypeError, ValueError, RecursionError, NotImplementedError) as exc:
        raise ValueError(f"unsupported JSON schema: {exc}") from exc
