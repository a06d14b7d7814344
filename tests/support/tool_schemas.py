"""Tool schemas and grammars the tests share: a strict schema that uses every bound the
converter enforces, a trip valid under it, a custom tool's regex, and Codex's own apply_patch
tool (from a captured Codex CLI request)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CODEX_REQUEST = Path(__file__).parents[1] / "data" / "codex" / "apply_patch_round2.json"
STRICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "offset": {"type": "integer", "minimum": -40, "maximum": 250},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "where": {
            "type": "object",
            "properties": {
                "lat": {"type": "number"},
                "precise": {"type": "boolean"},
                "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
            },
            "required": ["lat", "precise"],
            "additionalProperties": False,
        },
        "points": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["x"],
                "additionalProperties": False,
            },
            "maxItems": 2,
        },
    },
    "required": ["city", "unit", "days", "where"],
    "additionalProperties": False,
}
VALID_TRIP = {
    "city": 'Paris "1"\n',
    "unit": "celsius",
    "days": 14,
    "offset": -40,
    "tags": ["a", "b\\c"],
    "where": {"lat": -1.5e3, "precise": True, "note": None},
    "points": [{"x": 0}, {"x": 9}],
}

REGEX = r'(get|put) [a-z0-9_/]{1,16}( "[^"\\\n]{0,8}")?( \\[nt])?\n?'
CODEX_REQUEST = Path(__file__).parents[1] / "data" / "codex" / "apply_patch_round2.json"


def codex_apply_patch() -> dict[str, Any]:
    body = json.loads(CODEX_REQUEST.read_text())
    body = body.get("body", body)
    tool: dict[str, Any] = next(t for t in body["tools"] if t.get("type") == "custom")
    return tool
