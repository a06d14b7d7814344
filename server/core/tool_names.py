"""Tool names the model can write: harmony identifiers, mapped both ways.

Harmony renders tools as TypeScript-like declarations (`type get_weather = ...`) and the model
addresses them as `namespace.name`; a name with spaces, dots or dashes (`my-tool`, `web.search`)
would be an invalid declaration and an ambiguous recipient. Each request's tool names (and
namespaces) are turned into identifiers for the prompt and the sampling grammar; the recipients
the model writes are turned back into the client's tools (`ToolTarget`: namespace, name, kind)
before anything leaves the core, so no adapter parses a recipient string.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from server.contracts.events import (
    GenerationEvent,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
    ToolTarget,
)
from server.contracts.transcript import (
    BARE_TOOLS,
    Item,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    Transcript,
)

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def identifier(name: str) -> str:
    """`my-tool.v2` -> `my_tool_v2`; never empty, never starting with a digit."""
    safe = _INVALID.sub("_", name) or "_"
    return f"_{safe}" if safe[0].isdigit() else safe


class ToolNames:
    """The renaming of one request's tools; identity when every name is already valid."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._to_harmony: dict[tuple[str, str], tuple[str, str]] = {}
        self._from_harmony: dict[str, ToolTarget] = {}
        taken: set[tuple[str, str]] = set()
        for spec in tools:
            original = (spec.namespace, spec.name)
            if original in self._to_harmony:
                continue
            namespace, name = identifier(spec.namespace), identifier(spec.name)
            candidate, n = name, 1
            while (namespace, candidate) in taken:
                n += 1
                candidate = f"{name}_{n}"
            taken.add((namespace, candidate))
            self._to_harmony[original] = (namespace, candidate)
            target = ToolTarget(spec.name, spec.namespace, spec.kind)
            self._from_harmony[f"{namespace}.{candidate}"] = target
        self.renamed = any(k != v for k, v in self._to_harmony.items())

    def to_harmony(self, transcript: Transcript) -> Transcript:
        """The transcript as the model sees it: every tool name an identifier."""
        if not self.renamed:
            return transcript
        tools = tuple(self._spec(spec) for spec in transcript.tools)
        items = tuple(self._item(item) for item in transcript.items)
        return dataclasses.replace(transcript, tools=tools, items=items)

    def to_harmony_choice(self, choice: ToolChoice) -> ToolChoice:
        """A named tool_choice, renamed like the tools."""
        if choice.mode != "named" or choice.name is None:
            return choice
        namespace, name = self._rename(choice.namespace, choice.name)
        return dataclasses.replace(choice, namespace=namespace, name=name)

    def to_client(self, event: GenerationEvent) -> GenerationEvent:
        """A tool call's event with its target: the tool as the client named it."""
        if not isinstance(event, (SegmentStart, SegmentEnd)) or event.recipient is None:
            return event
        if event.kind is not SegmentKind.TOOL_CALL:
            return event
        return dataclasses.replace(event, target=self.target(event.recipient))

    def target(self, recipient: str) -> ToolTarget:
        """The tool a recipient names; one the request did not offer keeps the model's names.

        `functions.get_weather` -> get_weather; `container.exec` -> exec in namespace
        container; a bare `python` -> python in harmony's built-in python namespace
        (`browser.search` -> search in the browser namespace, as any dotted name); any other
        bare name -> that name in the default namespace.
        """
        known = self._from_harmony.get(recipient)
        if known is not None:
            return known
        namespace, dot, name = recipient.partition(".")
        if recipient in BARE_TOOLS:
            return ToolTarget(recipient, recipient)
        if not dot or not name:
            return ToolTarget(recipient)
        return ToolTarget(name, namespace)

    def _rename(self, namespace: str, name: str) -> tuple[str, str]:
        return self._to_harmony.get((namespace, name), (identifier(namespace), identifier(name)))

    def _spec(self, spec: ToolSpec) -> ToolSpec:
        namespace, name = self._rename(spec.namespace, spec.name)
        return dataclasses.replace(spec, namespace=namespace, name=name)

    def _item(self, item: Item) -> Item:
        if isinstance(item, (ToolCall, ToolResult)):
            namespace, name = self._rename(item.namespace, item.name)
            return dataclasses.replace(item, namespace=namespace, name=name)
        return item
