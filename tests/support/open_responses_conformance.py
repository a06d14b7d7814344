"""The project's conformance schema: what Open Responses requires of what /v1/responses sends.

Follows the Open Responses specification, version 2026-04-24 (https://www.openresponses.org).
It is written here, in the project's own terms, and covers only what this server sends: the
response object (the body and the one each lifecycle event carries), the output items it
produces (assistant messages, function calls, reasoning, compaction), each streamed event the
specification defines that the server emits, and the result of /v1/responses/compact together
with the items in it, which a client sends back as input. It states the specification's
requirements and nothing stricter: fields it requires are required, with their types; fields
it allows to be left out are optional; extra fields (OpenAI's extensions) are not its business.

`SCHEMA` is one JSON Schema (2020-12) document; `KINDS` names the definitions a test checks an
instance against, `EVENT_TYPES` the events it defines. The published OpenAPI document is not
part of the project; tests/support/open_responses.py can check against it as well
(GPT_OSS_OPEN_RESPONSES_SPEC).
"""

from __future__ import annotations

from typing import Any

SPEC_VERSION = "2026-04-24"
SCHEMA_URI = "urn:gpt-oss-server:open-responses-conformance"

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
ITEM_STATUS: Schema = {"enum": ["in_progress", "completed", "incomplete"]}


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema`, or JSON null (the field must be there either way if it is required)."""
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def record(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """An object with the `required` fields and, where present, the `optional` ones."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **(optional or {})},
    }


def tagged(
    kind: str, required: dict[str, Schema], optional: dict[str, Schema] | None = None
) -> Schema:
    """A record whose `type` is `kind`."""
    return record({"type": {"const": kind}, **required}, optional)


def by_type(name: str, members: dict[str, str]) -> Schema:
    """A union told apart by `type`: each `type` value -> the definition that then applies.
    A member whose type matches is checked alone, so its errors are the ones reported."""
    return {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"enum": list(members), "description": f"a known {name}"}},
        "allOf": [
            {"if": {"properties": {"type": {"const": kind}}}, "then": ref(definition)}
            for kind, definition in members.items()
        ],
    }


# ---------------------------------------------------------------------------- content parts

PARTS: dict[str, Schema] = {
    "output_text_part": tagged(
        "output_text",
        {"text": STRING, "annotations": array(ref("annotation"))},
        {"logprobs": array(ref("logprob"))},
    ),
    "input_text_part": tagged("input_text", {"text": STRING}),
    "reasoning_text_part": tagged("reasoning_text", {"text": STRING}),
    "summary_text_part": tagged("summary_text", {"text": STRING}),
    # the one annotation the specification defines (this server sends none)
    "annotation": tagged(
        "url_citation", {"url": STRING, "start_index": INTEGER, "end_index": INTEGER}
    ),
    "logprob": record(
        {
            "token": STRING,
            "logprob": NUMBER,
            "bytes": array(INTEGER),
            "top_logprobs": array(
                record({"token": STRING, "logprob": NUMBER, "bytes": array(INTEGER)})
            ),
        }
    ),
}

# ------------------------------------------------------------------------------ output items

ITEMS: dict[str, Schema] = {
    "output_item": by_type(
        "output item",
        {
            "message": "message_item",
            "function_call": "function_call_item",
            "reasoning": "reasoning_item",
            "compaction": "compaction_item",
        },
    ),
    "message_item": tagged(
        "message",
        {
            "id": STRING,
            "status": ITEM_STATUS,
            "role": {"enum": ["user", "assistant", "system", "developer"]},
            "content": array(
                by_type(
                    "message part",
                    {"output_text": "output_text_part", "input_text": "input_text_part"},
                )
            ),
        },
        {"phase": {"enum": ["commentary", "final_answer"]}},
    ),
    "function_call_item": tagged(
        "function_call",
        {
            "id": STRING,
            "call_id": STRING,
            "name": STRING,
            "arguments": STRING,
            "status": ITEM_STATUS,
        },
    ),
    # encrypted_content may be left out, but when sent it is a string: never null
    "reasoning_item": tagged(
        "reasoning",
        {"id": STRING, "summary": array(ref("summary_text_part"))},
        {"content": array(ref("reasoning_text_part")), "encrypted_content": STRING},
    ),
    "compaction_item": tagged(
        "compaction", {"id": STRING, "encrypted_content": STRING}, {"created_by": STRING}
    ),
}

# ------------------------------------------------------------- the response and its parts

FUNCTION_TOOL = tagged(
    "function",
    {
        "name": STRING,
        "description": nullable(STRING),
        "parameters": nullable({"type": "object"}),
        "strict": nullable(BOOLEAN),  # required: true, false, or null when not given
    },
)

TOOL_CHOICE: Schema = {
    "anyOf": [
        {"enum": ["none", "auto", "required"]},
        record({"type": {"const": "function"}}, {"name": STRING}),
        record(
            {
                "type": {"const": "allowed_tools"},
                "tools": array(record({"type": {"const": "function"}}, {"name": STRING})),
                "mode": {"enum": ["none", "auto", "required"]},
            }
        ),
    ]
}

TEXT_FORMAT = by_type(
    "text format",
    {
        "text": "text_format_text",
        "json_object": "text_format_json_object",
        "json_schema": "text_format_json_schema",
    },
)

RESPONSE: dict[str, Schema] = {
    "response": record(
        {
            "id": STRING,
            "object": {"const": "response"},
            "created_at": INTEGER,
            "completed_at": nullable(INTEGER),
            "status": STRING,
            "incomplete_details": nullable(record({"reason": STRING})),
            "model": STRING,
            "previous_response_id": nullable(STRING),
            "instructions": nullable(STRING),
            "output": array(ref("output_item")),
            "error": nullable(record({"code": STRING, "message": STRING})),
            "tools": array(ref("function_tool")),  # the only tool the specification defines
            "tool_choice": TOOL_CHOICE,
            "truncation": {"enum": ["auto", "disabled"]},
            "parallel_tool_calls": BOOLEAN,
            "text": record(
                {"format": TEXT_FORMAT}, {"verbosity": {"enum": ["low", "medium", "high"]}}
            ),
            "top_p": NUMBER,
            "presence_penalty": NUMBER,
            "frequency_penalty": NUMBER,
            "top_logprobs": INTEGER,
            "temperature": NUMBER,
            "reasoning": nullable(
                record(
                    {
                        "effort": nullable({"enum": ["none", "low", "medium", "high", "xhigh"]}),
                        "summary": nullable({"enum": ["concise", "detailed", "auto"]}),
                    }
                )
            ),
            "usage": nullable(ref("usage")),
            "max_output_tokens": nullable(INTEGER),
            "max_tool_calls": nullable(INTEGER),
            "store": BOOLEAN,
            "background": BOOLEAN,
            "service_tier": STRING,
            "metadata": {},  # required; the specification sets no type on it
            "safety_identifier": nullable(STRING),
            "prompt_cache_key": nullable(STRING),
        }
    ),
    "function_tool": FUNCTION_TOOL,
    "text_format_text": tagged("text", {}),
    "text_format_json_object": tagged("json_object", {}),
    "text_format_json_schema": tagged(
        "json_schema",
        {"name": STRING, "description": nullable(STRING), "schema": {}, "strict": BOOLEAN},
    ),
    "usage": record(
        {
            "input_tokens": INTEGER,
            "output_tokens": INTEGER,
            "total_tokens": INTEGER,
            "input_tokens_details": record({"cached_tokens": INTEGER}),
            "output_tokens_details": record({"reasoning_tokens": INTEGER}),
        }
    ),
}

# ------------------------------------------------------------------------------ compaction

COMPACTION: dict[str, Schema] = {
    "compaction_resource": record(
        {
            "id": STRING,
            "object": {"const": "response.compaction"},
            "created_at": INTEGER,
            "output": array(ref("output_item")),
            "usage": ref("usage"),
        }
    ),
    # the compacted items, sent back as the next request's input: the kept user messages and
    # the compaction item
    "input_item": by_type(
        "input item", {"message": "input_message", "compaction": "input_compaction"}
    ),
    "input_message": tagged(
        "message",
        {
            "role": {"enum": ["user", "system", "developer"]},
            "content": {
                "anyOf": [STRING, array(by_type("input part", {"input_text": "input_text_part"}))]
            },
        },
        {"id": nullable(STRING), "status": nullable(STRING)},
    ),
    "input_compaction": tagged(
        "compaction", {"encrypted_content": STRING}, {"id": nullable(STRING)}
    ),
}

# ---------------------------------------------------------------------------------- events


def _event(kind: str, fields: dict[str, Schema]) -> Schema:
    return tagged(kind, {"sequence_number": INTEGER, **fields})


_LIFECYCLE = {"response": ref("response")}
_ITEM = {"output_index": INTEGER, "item": nullable(ref("output_item"))}
_IN_ITEM = {"item_id": STRING, "output_index": INTEGER}
_IN_CONTENT = {**_IN_ITEM, "content_index": INTEGER}
_IN_SUMMARY = {**_IN_ITEM, "summary_index": INTEGER}
_CONTENT_PART = by_type(
    "content part", {"output_text": "output_text_part", "reasoning_text": "reasoning_text_part"}
)

EVENT_FIELDS: dict[str, dict[str, Schema]] = {
    "response.created": _LIFECYCLE,
    "response.in_progress": _LIFECYCLE,
    "response.completed": _LIFECYCLE,
    "response.incomplete": _LIFECYCLE,
    "response.failed": _LIFECYCLE,
    "response.output_item.added": _ITEM,
    "response.output_item.done": _ITEM,
    "response.content_part.added": {**_IN_CONTENT, "part": _CONTENT_PART},
    "response.content_part.done": {**_IN_CONTENT, "part": _CONTENT_PART},
    "response.output_text.delta": {**_IN_CONTENT, "delta": STRING},
    "response.output_text.done": {**_IN_CONTENT, "text": STRING},
    # the specification's names for the raw reasoning text (OpenAI's are response.reasoning_text.*)
    "response.reasoning.delta": {**_IN_CONTENT, "delta": STRING},
    "response.reasoning.done": {**_IN_CONTENT, "text": STRING},
    "response.reasoning_summary_part.added": {**_IN_SUMMARY, "part": ref("summary_text_part")},
    "response.reasoning_summary_part.done": {**_IN_SUMMARY, "part": ref("summary_text_part")},
    "response.reasoning_summary_text.delta": {**_IN_SUMMARY, "delta": STRING},
    "response.reasoning_summary_text.done": {**_IN_SUMMARY, "text": STRING},
    "response.function_call_arguments.delta": {**_IN_ITEM, "delta": STRING},
    "response.function_call_arguments.done": {**_IN_ITEM, "arguments": STRING},
}
EVENT_TYPES = frozenset(EVENT_FIELDS)

EVENTS: dict[str, Schema] = {
    "event": by_type("event", {kind: f"event:{kind}" for kind in EVENT_FIELDS}),
    **{f"event:{kind}": _event(kind, fields) for kind, fields in EVENT_FIELDS.items()},
}

# ---------------------------------------------------------------------------- the document

SCHEMA: Schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_URI,
    "title": f"gpt-oss-server: Open Responses conformance ({SPEC_VERSION})",
    "x-open-responses-version": SPEC_VERSION,
    "$defs": {**PARTS, **ITEMS, **RESPONSE, **COMPACTION, **EVENTS},
}

# what a test checks an instance as
KINDS = (
    "response",
    "output_item",
    "reasoning_item",
    "compaction_resource",
    "input_item",
    "event",
)
