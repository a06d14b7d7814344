"""The Responses streaming grammar, checked by a stack machine over a whole stream.

    stream    := response.created response.in_progress (in_progress | item)* terminal
    item      := output_item.added part output_item.done             (message)
    reasoning := output_item.added part? summary? output_item.done    (at least one of them)
    part      := content_part.added delta* text.done content_part.done
    summary   := reasoning_summary_part.added reasoning_summary_text.delta*
                 reasoning_summary_text.done reasoning_summary_part.done
    call      := output_item.added delta* call.done output_item.done  (function / custom tool)

plus: every event validates against the openai SDK's own `ResponseStreamEvent` types;
sequence_number counts from 0 without gaps; output_index, content_index and item_id agree
across an item's events; concatenated deltas equal the done text, the part text and the item
content; the terminal event's `response.output` is exactly the sequence of finished items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

SDK_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TERMINALS = ("response.completed", "response.incomplete", "response.failed")


@dataclass(frozen=True)
class _Rules:
    """The events of one item type: its content part (if any), delta, done and done field."""

    part: str | None
    delta: str
    done: str
    done_field: str


RULES = {
    "reasoning": _Rules(
        "reasoning_text", "response.reasoning_text.delta", "response.reasoning_text.done", "text"
    ),
    "message": _Rules(
        "output_text", "response.output_text.delta", "response.output_text.done", "text"
    ),
    "function_call": _Rules(
        None,
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "arguments",
    ),
    "custom_tool_call": _Rules(
        None,
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "input",
    ),
}


@dataclass
class _Open:
    item: dict[str, Any]
    output_index: int
    rules: _Rules
    step: str = "added"  # added -> part -> text_done -> part_done | added -> text_done
    text: str = ""
    has_part: bool = False
    summary: str | None = None  # the summary part's text, once added
    summary_step: str = ""  # added -> text_done -> part_done


@dataclass
class CheckedStream:
    """A stream that passed every check: its events, finished items and terminal response."""

    events: list[dict[str, Any]]
    items: list[dict[str, Any]] = field(default_factory=list)
    terminal: dict[str, Any] = field(default_factory=dict)
    keepalives: int = 0

    @property
    def response(self) -> Response:
        return Response.model_validate(self.terminal["response"])

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]


def check_stream(events: list[dict[str, Any]]) -> CheckedStream:
    """Assert the grammar over `events` (decoded `data:` payloads, in order)."""
    assert events, "empty stream"
    for event in events:
        SDK_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events))), "sequence gaps"
    assert events[0]["type"] == "response.created", events[0]["type"]
    assert events[1]["type"] == "response.in_progress", events[1]["type"]
    terminals = [i for i, e in enumerate(events) if e["type"] in TERMINALS]
    assert terminals == [len(events) - 1], f"terminal events at {terminals} of {len(events)}"
    checker = _Checker(CheckedStream(events=events, terminal=events[-1]))
    for position, event in enumerate(events):
        try:
            checker.step(event, position)
        except AssertionError as exc:
            raise AssertionError(f"event {position} ({event['type']}): {exc}") from exc
    return checker.checked


class _Checker:
    """The stack: at most one open item; lifecycle events only between items."""

    def __init__(self, checked: CheckedStream) -> None:
        self.checked = checked
        self.response_id = checked.events[0]["response"]["id"]
        self.open: _Open | None = None
        self.ids: set[str] = set()

    def step(self, event: dict[str, Any], position: int) -> None:
        kind = event["type"]
        if "response" in event:
            self._lifecycle(event, position)
        elif kind == "response.output_item.added":
            assert self.open is None, "an item was added while another is open"
            self.open = self._added(event)
        else:
            item = self.open
            assert item is not None, "item event outside an item"
            assert event["output_index"] == item.output_index, "output_index changed"
            if kind != "response.output_item.done":
                assert event["item_id"] == item.item["id"], "item_id changed"
            self.open = self._inside(item, event)

    def _lifecycle(self, event: dict[str, Any], position: int) -> None:
        kind = event["type"]
        assert event["response"]["id"] == self.response_id, "response id changed"
        assert self.open is None, "lifecycle event inside an item"
        if kind == "response.in_progress" and position > 1:
            self.checked.keepalives += 1
        elif kind == "response.created":
            assert position == 0
        if kind in TERMINALS:
            _check_terminal(self.checked, event)

    def _added(self, event: dict[str, Any]) -> _Open:
        item = event["item"]
        assert event["output_index"] == len(self.checked.items), "output_index is not the next"
        assert item["type"] in RULES, f"unexpected item type {item['type']}"
        assert item["id"] not in self.ids, "duplicate item id"
        self.ids.add(item["id"])
        assert item.get("status") == "in_progress"
        if item["type"] == "reasoning":
            assert item["summary"] == [], "reasoning items open with summary: []"
        if item["type"] in ("reasoning", "message"):
            assert item["content"] == []
        if item["type"] in ("function_call", "custom_tool_call"):
            assert item["call_id"], "calls carry their call_id from the start"
            assert item["name"], "calls carry their name from the start"
        return _Open(item=item, output_index=event["output_index"], rules=RULES[item["type"]])

    def _inside(self, item: _Open, event: dict[str, Any]) -> _Open | None:
        kind, rules = event["type"], item.rules
        text_step = "part" if rules.part else "added"
        if kind.startswith("response.reasoning_summary_"):
            _summary_step(item, event)
        elif kind == "response.content_part.added":
            assert rules.part is not None, "a content part on a call"
            assert item.step == "added", "content part out of place"
            assert item.summary is None, "content part after the summary"
            assert event["content_index"] == 0
            assert event["part"]["type"] == rules.part
            assert event["part"]["text"] == ""
            item.step, item.has_part = "part", True
        elif kind == rules.delta:
            assert item.step == text_step, "delta out of place"
            assert event.get("content_index", 0) == 0
            item.text += event["delta"]
        elif kind == rules.done:
            assert item.step == text_step, "done out of place"
            assert event[rules.done_field] == item.text, "done text differs from the deltas"
            item.step = "text_done"
        elif kind == "response.content_part.done":
            assert rules.part is not None, "a content part on a call"
            assert item.step == "text_done", "content part done out of place"
            assert event["part"]["type"] == rules.part
            assert event["part"]["text"] == item.text
            item.step = "part_done"
        elif kind == "response.output_item.done":
            _check_closing(item)
            _check_done_item(item, event["item"])
            self.checked.items.append(event["item"])
            return None
        else:
            raise AssertionError(f"{kind} inside a {item.item['type']} item")
        return item


def _summary_step(item: _Open, event: dict[str, Any]) -> None:
    """The reasoning summary part: only in a reasoning item, after its content part (if any)."""
    kind = event["type"]
    assert item.item["type"] == "reasoning", f"{kind} inside a {item.item['type']} item"
    assert event["summary_index"] == 0, "one summary part per reasoning item"
    if kind == "response.reasoning_summary_part.added":
        assert item.summary is None, "a second summary part"
        assert item.step in ("added", "part_done"), "summary part inside the content part"
        assert event["part"] == {"type": "summary_text", "text": ""}
        item.summary, item.summary_step = "", "added"
        return
    assert item.summary is not None, f"{kind} before reasoning_summary_part.added"
    if kind == "response.reasoning_summary_text.delta":
        assert item.summary_step == "added", "summary delta out of place"
        item.summary += event["delta"]
    elif kind == "response.reasoning_summary_text.done":
        assert item.summary_step == "added", "summary text done out of place"
        assert event["text"] == item.summary, "summary done text differs from the deltas"
        item.summary_step = "text_done"
    elif kind == "response.reasoning_summary_part.done":
        assert item.summary_step == "text_done", "summary part done out of place"
        assert event["part"] == {"type": "summary_text", "text": item.summary}
        item.summary_step = "part_done"
    else:
        raise AssertionError(f"unknown summary event {kind}")


def _check_closing(item: _Open) -> None:
    rules = item.rules
    if item.summary is not None:
        assert item.summary_step == "part_done", "closed inside the summary part"
    if item.item["type"] == "reasoning":
        assert item.has_part or item.summary is not None, "a reasoning item with nothing in it"
        if item.has_part:
            assert item.step == "part_done", "closed inside the content part"
        return
    assert item.step == ("part_done" if rules.part else "text_done"), "closed early"


def _check_done_item(item: _Open, done: dict[str, Any]) -> None:
    added = item.item
    assert done["id"] == added["id"], "item id changed"
    assert done["type"] == added["type"], "item type changed"
    assert done["status"] in ("completed", "incomplete")
    kind = done["type"]
    if kind == "reasoning":
        summary = [] if item.summary is None else [{"type": "summary_text", "text": item.summary}]
        assert done["summary"] == summary, "the item's summary differs from its summary part"
        content = [{"type": "reasoning_text", "text": item.text}] if item.has_part else []
        assert (done.get("content") or []) == content, "the item's content differs from its part"
    elif kind == "message":
        assert done["role"] == "assistant"
        assert [part["text"] for part in done["content"]] == [item.text]
    else:
        assert done["call_id"] == added["call_id"]
        assert done["name"] == added["name"]
        assert done.get("namespace") == added.get("namespace")
        assert done[item.rules.done_field] == item.text


def _check_terminal(checked: CheckedStream, event: dict[str, Any]) -> None:
    response = event["response"]
    Response.model_validate(response)
    assert response["output"] == checked.items, "terminal output differs from the items"
    expected = {
        "response.completed": "completed",
        "response.incomplete": "incomplete",
        "response.failed": ("failed", "cancelled"),
    }[event["type"]]
    assert response["status"] in expected, response["status"]
    if event["type"] == "response.incomplete":
        assert response["incomplete_details"]["reason"] == "max_output_tokens"
    if event["type"] == "response.failed":
        assert response["error"]["message"]
    usage = response["usage"]
    if usage is not None:
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
