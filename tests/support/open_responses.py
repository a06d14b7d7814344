"""What the server sends, checked against the Open Responses specification's requirements.

Always against the project's own conformance schema (tests/support/open_responses_conformance.py,
spec version 2026-04-24), which states what the specification requires of the bodies, items and
streamed events this server sends. When GPT_OSS_OPEN_RESPONSES_SPEC names a copy of the
specification's published OpenAPI document (public/openapi/2026-04-24/openapi.json from
openresponses.org; not part of this repository), also against the component schema the
specification names for each instance: an OpenAPI 3.1 component schema is JSON Schema 2020-12,
so `jsonschema` validates as a client generated from the specification would parse it.

Events and items the specification does not define (OpenAI's extensions: custom tools, MCP,
hosted tools, response.reasoning_text.*) are not its to judge; `check_events` returns them.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.support.open_responses_conformance import (
    EVENT_TYPES,
    KINDS,
    SCHEMA,
    SCHEMA_URI,
    SPEC_VERSION,
)

SPEC_ENV = "GPT_OSS_OPEN_RESPONSES_SPEC"
DOCUMENT_URI = "urn:openresponses:openapi"

# each kind of instance -> the published document's component schema for it
PUBLISHED_COMPONENTS = {
    "response": "ResponseResource",
    "output_item": "ItemField",
    "reasoning_item": "ReasoningBody",
    "compaction_resource": "CompactResource",
    "input_item": "ItemParam",
}


# ------------------------------------------------------------------------ the own schema


@cache
def _own_validator(kind: str) -> Draft202012Validator:
    assert kind in KINDS, kind
    Draft202012Validator.check_schema(SCHEMA)
    resource = Resource.from_contents(SCHEMA, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(SCHEMA_URI, resource)
    return Draft202012Validator({"$ref": f"{SCHEMA_URI}#/$defs/{kind}"}, registry=registry)


# ------------------------------------------------------------------ the published document


def published_path() -> Path | None:
    """The published OpenAPI document GPT_OSS_OPEN_RESPONSES_SPEC names, if it does."""
    named = os.environ.get(SPEC_ENV)
    return Path(named) if named else None


@cache
def document(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert spec["info"]["version"] == SPEC_VERSION, (path, spec["info"]["version"])
    return spec


@cache
def _registry(path: Path) -> Registry[Any]:
    resource = Resource.from_contents(document(path), default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, resource)
    return registry


@cache
def _published_validator(path: Path, component: str) -> Draft202012Validator:
    """A validator of the component schema `component` (#/components/schemas/<component>)."""
    assert component in document(path)["components"]["schemas"], component
    schema = {"$ref": f"{DOCUMENT_URI}#/components/schemas/{component}"}
    return Draft202012Validator(schema, registry=_registry(path))


@cache
def published_events(path: Path) -> dict[str, str]:
    """The streaming events the published document defines: event type -> component name."""
    post = document(path)["paths"]["/responses"]["post"]
    stream = post["responses"]["200"]["content"]["text/event-stream"]["schema"]
    events: dict[str, str] = {}
    for option in stream["oneOf"]:
        component = option["$ref"].rsplit("/", 1)[-1]
        schema = document(path)["components"]["schemas"][component]
        (event_type,) = schema["properties"]["type"]["enum"]
        events[event_type] = component
    return events


# ------------------------------------------------------------------------------- checking


def problems(kind: str, instance: Any) -> list[str]:
    """Every way `instance` fails the own schema's `kind` (and the published document's
    component for it, when one is named); empty: it conforms."""
    found = _problems("conformance schema", _own_validator(kind), instance)
    path = published_path()
    if path is not None:
        if kind == "event":
            component = published_events(path)[instance["type"]]
        else:
            component = PUBLISHED_COMPONENTS[kind]
        validator = _published_validator(path, component)
        found += _problems(f"published {component}", validator, instance)
    return found


def check(kind: str, instance: Any) -> None:
    """`instance` conforms as a `kind`, or the assertion lists why not."""
    found = problems(kind, instance)
    assert not found, f"not a valid Open Responses {kind}:\n" + "\n".join(found)


def check_events(events: list[dict[str, Any]], *, all_spec: bool = False) -> list[str]:
    """Every event of a stream the specification defines conforms; `all_spec`: every event is
    one it defines. Returns the types it does not define."""
    path = published_path()
    foreign = []
    for event in events:
        defined = event["type"] in EVENT_TYPES
        if path is not None:  # the own schema knows the events the published document does
            published = event["type"] in published_events(path)
            assert defined == published, (event["type"], defined, published)
        if not defined:
            foreign.append(event["type"])
            continue
        check("event", event)
    assert not (all_spec and foreign), f"events the specification does not define: {foreign}"
    return foreign


def _problems(source: str, validator: Draft202012Validator, instance: Any) -> list[str]:
    errors = sorted(validator.iter_errors(instance), key=_path)
    return [f"{source}: {_describe(error)}" for error in errors]


def _path(error: ValidationError) -> str:
    return "/".join(str(part) for part in error.absolute_path)


def _describe(error: ValidationError) -> str:
    """The error, or for a union (oneOf) the errors of the branch whose `type` matched."""
    if not error.context:
        return f"/{_path(error)}: {error.message}"
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    matched = [
        errors
        for errors in branches.values()
        if not any(list(sub.relative_path)[-1:] == ["type"] for sub in errors)
    ]
    if len(matched) == 1:
        return "; ".join(_describe(sub) for sub in matched[0])
    best = best_match(error.context)
    return f"/{_path(best or error)}: {(best or error).message}"
