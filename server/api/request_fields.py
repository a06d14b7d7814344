"""Request fields: parts of a request every adapter reads, parsed to the core's types or a 400.

Reasoning effort and summary style, tool choice, response format, text content parts, and any
part of a body as a pydantic model (`parse_as`; `Lenient`, the base of the request models);
each error names where in the request it is.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from server.contracts.errors import InvalidRequest
from server.contracts.transcript import (
    FUNCTIONS_NAMESPACE,
    ReasoningEffort,
    ResponseFormat,
    ToolChoice,
)
from server.core.visibility import SummaryStyle

_EFFORTS: dict[str, ReasoningEffort] = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def clamp_effort(value: str | None, param: str) -> ReasoningEffort | None:
    """Map an OpenAI/OpenRouter effort onto harmony's low | medium | high."""
    if value is None:
        return None
    effort = _EFFORTS.get(value.lower())
    if effort is None:
        raise InvalidRequest(
            f"unknown reasoning effort {value!r}; use one of {', '.join(_EFFORTS)}", param=param
        )
    return effort


_SUMMARY_STYLES: dict[str, SummaryStyle | None] = {
    "auto": "auto",
    "concise": "concise",
    "detailed": "detailed",
    "none": None,
}


def to_summary_style(value: str | None, param: str) -> SummaryStyle | None:
    """A requested reasoning summary: auto | concise | detailed, or none (None)."""
    if value is None:
        return None
    if value not in _SUMMARY_STYLES:
        raise InvalidRequest(
            f"unknown reasoning summary {value!r}; use one of {', '.join(_SUMMARY_STYLES)}",
            param=param,
        )
    return _SUMMARY_STYLES[value]


def effort_for_budget(max_tokens: int) -> ReasoningEffort:
    """The effort whose typical reasoning length fits a reasoning token budget."""
    if max_tokens < 2048:
        return "low"
    return "medium" if max_tokens < 8192 else "high"


ModelT = TypeVar("ModelT", bound=BaseModel)


class Lenient(BaseModel):
    """A request part that keeps the fields it does not name (clients send more than they must)."""

    model_config = ConfigDict(extra="allow")


def parse_as(model: type[ModelT], raw: dict[str, Any], param: str) -> ModelT:
    """A part of a request (an input item, a tool, a block) as `model`, or a 400 naming where
    in the request the first problem is (`param` is the part's own location)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        location = f"{param}.{where}" if where else param
        raise InvalidRequest(f"{location}: {error['msg']}", param=location) from exc


def text_of_parts(parts: list[Any], allowed: tuple[str, ...], param: str) -> str:
    """Join the text of content parts; anything but text is refused (gpt-oss reads text only)."""
    texts = []
    for part in parts:
        if part.type not in allowed:
            raise InvalidRequest(
                f"content part type {part.type!r} is not supported: gpt-oss reads text only",
                param=param,
            )
        texts.append(part.text or "")
    return "\n".join(texts)


_CHOICE_MODES: dict[str, Literal["auto", "none", "required"]] = {
    "auto": "auto",
    "none": "none",
    "required": "required",
}


def to_tool_choice(value: str | dict[str, Any] | None) -> ToolChoice:
    """tool_choice of either API -> ToolChoice (generation checks that a named tool exists).

    Accepts "auto" | "none" | "required", `{"type": "function", "name": ...}` (Responses, with an
    optional `namespace`), `{"type": "function", "function": {"name": ...}}` (Chat),
    `{"type": "custom", ...}` and `{"type": "allowed_tools", "mode": ...}` (the subset is not
    enforced: it is treated as its mode).
    """
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        mode = _CHOICE_MODES.get(value)
        if mode is None:
            raise InvalidRequest(
                f"tool_choice must be one of {', '.join(_CHOICE_MODES)} or an object naming a "
                f"tool, not {value!r}",
                param="tool_choice",
            )
        return ToolChoice(mode=mode)
    kind = value.get("type")
    if kind == "allowed_tools":
        nested = value.get("allowed_tools")
        mode_name = (nested if isinstance(nested, dict) else value).get("mode", "auto")
        return to_tool_choice(str(mode_name))
    if kind in ("function", "custom"):
        nested = value.get(kind)
        named = nested if isinstance(nested, dict) else value
        name = named.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("tool_choice names no tool", param="tool_choice")
        namespace = named.get("namespace") or FUNCTIONS_NAMESPACE
        return ToolChoice(mode="named", name=name, namespace=str(namespace))
    if kind == "mcp":  # Responses: an MCP server's tool, or any tool of that server
        label, name = value.get("server_label"), value.get("name")
        if not isinstance(label, str) or not label:
            raise InvalidRequest(
                "tool_choice of type mcp needs a server_label", param="tool_choice"
            )
        if name is None:
            return ToolChoice(mode="required")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("tool_choice names no tool", param="tool_choice")
        return ToolChoice(mode="named", name=name, namespace=label)
    raise InvalidRequest(
        f"tool_choice of type {kind!r} is not supported: this server runs function, custom "
        "and MCP tools only",
        param="tool_choice",
    )


def to_response_format(value: dict[str, Any] | None, param: str) -> ResponseFormat | None:
    """Chat `response_format` or Responses `text.format` -> ResponseFormat (None: plain text).

    Chat nests the schema (`{"type": "json_schema", "json_schema": {name, schema, ...}}`);
    Responses puts it beside the type (`{"type": "json_schema", "name", "schema", ...}`).
    """
    if value is None:
        return None
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(kind="json_object")
    if kind != "json_schema":
        raise InvalidRequest(
            f"unknown format type {kind!r}; use text, json_object or json_schema", param=param
        )
    nested = value.get("json_schema")
    spec = nested if isinstance(nested, dict) else value
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest("a json_schema format needs a `schema` object", param=param)
    return ResponseFormat(
        kind="json_schema",
        name=str(spec.get("name") or "response"),
        schema=schema,
        description=str(spec.get("description") or ""),
        strict=bool(spec.get("strict")),
    )
