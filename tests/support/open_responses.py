"""What the server sends, checked against the Open Responses specification's own OpenAPI schema.

The schema is vendored whole (tests/data/openresponses/, its source and version in the README
there): an OpenAPI 3.1 component schema is JSON Schema 2020-12, so `jsonschema` validates each
body, streamed event and item against the component the specification names for it, as a
client generated from the specification would parse it. Events and items the specification
does not define (OpenAI's extensions: custom tools, MCP, hosted tools) are not its to judge;
`spec_events` says which events it defines.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_VERSION = "2026-04-24"
SPEC_FILE = Path(__file__).parents[1] / "data" / "openresponses" / f"openapi-{SPEC_VERSION}.json"
DOCUMENT_URI = "urn:openresponses:openapi"


@cache
def document() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(SPEC_FILE.read_text(encoding="utf-8"))
    assert spec["info"]["version"] == SPEC_VERSION
    return spec


@cache
def _registry() -> Registry[Any]:
    resource = Resource.from_contents(document(), default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, resource)
    return registry


@cache
def validator(component: str) -> Draft202012Validator:
    """A validator of the component schema `component` (#/components/schemas/<component>)."""
    assert component in document()["components"]["schemas"], component
    schema = {"$ref": f"{DOCUMENT_URI}#/components/schemas/{component}"}
    return Draft202012Validator(schema, registry=_registry())


def problems(component: str, instance: Any) -> list[str]:
    """Every way `instance` fails the component's schema (empty: it conforms)."""
    errors = sorted(validator(component).iter_errors(instance), key=_path)
    return [_describe(error) for error in errors]


def check(component: str, instance: Any) -> None:
    """`instance` conforms to the component's schema, or the assertion lists why not."""
    found = problems(component, instance)
    assert not found, f"not a valid Open Responses {component}:\n" + "\n".join(found)


@cache
def spec_events() -> dict[str, str]:
    """The streaming events the specification defines: event type -> component name."""
    post = document()["paths"]["/responses"]["post"]
    stream = post["responses"]["200"]["content"]["text/event-stream"]["schema"]
    events: dict[str, str] = {}
    for option in stream["oneOf"]:
        component = option["$ref"].rsplit("/", 1)[-1]
        schema = document()["components"]["schemas"][component]
        (event_type,) = schema["properties"]["type"]["enum"]
        events[event_type] = component
    return events


def check_events(events: list[dict[str, Any]], *, all_spec: bool = False) -> list[str]:
    """Every event of a stream the specification defines conforms to its schema; `all_spec`:
    every event is one it defines. Returns the types it does not define."""
    known = spec_events()
    foreign = []
    for event in events:
        component = known.get(event["type"])
        if component is None:
            foreign.append(event["type"])
            continue
        check(component, event)
    assert not (all_spec and foreign), f"events the specification does not define: {foreign}"
    return foreign


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
