"""The Responses streaming grammar, checked by a stack machine over a whole stream.

    stream    := response.created response.in_progress (in_progress | item)* terminal
    item      := output_item.added part output_item.done             (message)
    reasoning := output_item.added part? summary? output_item.done    (at least one of them)
    part      := content_part.added delta* text.done content_part.done
    summary   := reasoning_summary_part.added reasoning_summary_text.delta*
                 reasoning_summary_text.done reasoning_summary_part.done
    call      := output_item.added delta* call.done output_item.done  (function / custom tool)
    mcp_call  := output_item.added mcp_call.in_progress mcp_call_arguments.delta*
                 mcp_call_arguments.done mcp_call.in_progress* (mcp_call.completed |
                 mcp_call.failed)? output_item.done
                 (a running call's event repeated is a keepalive, as between items)
    listing   := output_item.added mcp_list_tools.in_progress
                 (mcp_list_tools.completed | mcp_list_tools.failed) output_item.done
    approval  := output_item.added output_item.done                   (mcp_approval_request)
    code      := output_item.added code_interpreter_call.in_progress
                 code_interpreter_call_code.delta* code_interpreter_call_code.done
                 code_interpreter_call.interpreting+ code_interpreter_call.completed?
                 output_item.done                                     (code_interpreter_call)
    search    := output_item.added web_search_call.in_progress web_search_call.searching+
                 web_search_call.completed? output_item.done          (web_search_call)

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
    "mcp_call": _Rules(
        None, "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done", "arguments"
    ),
}
# MCP items that have no text of their own to stream: their steps, in order
MCP_STEPS = {
    "mcp_list_tools": (
        "response.mcp_list_tools.in_progress",
        ("response.mcp_list_tools.completed", "response.mcp_list_tools.failed"),
    ),
    "mcp_approval_request": (),
}
# built-in tools' items: (event, the step it is allowed in, the step after it), in order
BUILTIN_STEPS = {
    "code_interpreter_call": {
        "response.code_interpreter_call.in_progress": ("added", "calling"),
        "response.code_interpreter_call_code.delta": ("calling", "calling"),
        "response.code_interpreter_call_code.done": ("calling", "text_done"),
        "response.code_interpreter_call.interpreting": ("text_done", "running"),
        "response.code_interpreter_call.completed": ("running", "ran"),
    },
    "web_search_call": {
        "response.web_search_call.in_progress": ("added", "calling"),
        "response.web_search_call.searching": ("calling", "running"),
        "response.web_search_call.completed": ("running", "ran"),
    },
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
        assert item["type"] in (*RULES, *MCP_STEPS, *BUILTIN_STEPS), (
            f"unexpected item type {item['type']}"
        )
        assert item["id"] not in self.ids, "duplicate item id"
        self.ids.add(item["id"])
        if item["type"] in (*MCP_STEPS, *BUILTIN_STEPS):
            rules = _Rules(None, "", "", "")
            return _Open(item=item, output_index=event["output_index"], rules=rules)
        assert item.get("status") == "in_progress"
        if item["type"] == "reasoning":
            assert item["summary"] == [], "reasoning items open with summary: []"
        if item["type"] in ("reasoning", "message"):
            assert item["content"] == []
        if item["type"] in ("function_call", "custom_tool_call"):
            assert item["call_id"], "calls carry their call_id from the start"
            assert item["name"], "calls carry their name from the start"
        if item["type"] == "mcp_call":
            assert item["name"], "MCP calls name their tool at once"
            assert item["server_label"], "MCP calls name their server at once"
            assert item["arguments"] == ""
            assert item.get("output") is None
        return _Open(item=item, output_index=event["output_index"], rules=RULES[item["type"]])

    def _inside(self, item: _Open, event: dict[str, Any]) -> _Open | None:
        kind, rules = event["type"], item.rules
        if item.item["type"] in MCP_STEPS:
            return self._mcp_step(item, event)
        if item.item["type"] in BUILTIN_STEPS:
            return self._builtin_step(item, event)
        if item.item["type"] == "mcp_call" and kind.startswith("response.mcp_call."):
            self.checked.keepalives += _mcp_call_step(item, kind)
            return item
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
            assert item.step in (text_step, "calling"), "delta out of place"
            assert event.get("content_index", 0) == 0
            item.text += event["delta"]
        elif kind == rules.done:
            assert item.step in (text_step, "calling"), "done out of place"
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

    def _mcp_step(self, item: _Open, event: dict[str, Any]) -> _Open | None:
        """An MCP listing or approval request: its fixed steps, then output_item.done."""
        kind = event["type"]
        steps = MCP_STEPS[item.item["type"]]
        done_steps = int(item.step) if item.step.isdigit() else 0
        if kind == "response.output_item.done":
            assert done_steps == len(steps), f"closed after {done_steps} of {len(steps)} steps"
            done = event["item"]
            assert done["id"] == item.item["id"]
            assert done["type"] == item.item["type"]
            if done["type"] == "mcp_list_tools":
                failed = item.text == "response.mcp_list_tools.failed"
                assert bool(done.get("error")) == failed, "a failed listing carries its error"
            self.checked.items.append(done)
            return None
        assert done_steps < len(steps), f"{kind} after the last step"
        expected = steps[done_steps]
        assert kind in (expected if isinstance(expected, tuple) else (expected,)), kind
        item.step, item.text = str(done_steps + 1), kind
        return item

    def _builtin_step(self, item: _Open, event: dict[str, Any]) -> _Open | None:
        """A code interpreter or web search call: its steps in order, then output_item.done
        (completed after `.completed`; failed or incomplete without it)."""
        kind, added = event["type"], item.item
        if kind == "response.output_item.done":
            done = event["item"]
            assert (done["id"], done["type"]) == (added["id"], added["type"])
            assert added["status"] == "in_progress"
            assert item.step in ("running", "ran"), f"closed early, at {item.step}"
            expected = ("completed",) if item.step == "ran" else ("failed", "incomplete")
            assert done["status"] in expected, (done["status"], item.step)
            if done["type"] == "code_interpreter_call":
                assert done["code"] == item.text, "the item's code differs from the deltas"
                assert done["container_id"] == added["container_id"], "container changed"
                if done["status"] == "completed":
                    assert done["outputs"], "a completed run shows its outputs"
            self.checked.items.append(done)
            return None
        steps = BUILTIN_STEPS[added["type"]]
        assert kind in steps, f"{kind} inside a {added['type']} item"
        before, after = steps[kind]
        if after == "running" and item.step == "running":  # the running event again: a keepalive
            self.checked.keepalives += 1
            return item
        assert item.step == before, f"{kind} out of place (at {item.step})"
        if kind.endswith("_code.delta"):
            item.text += event["delta"]
        elif kind.endswith("_code.done"):
            assert event["code"] == item.text, "done code differs from the deltas"
        item.step = after
        return item


def _mcp_call_step(item: _Open, kind: str) -> int:
    """mcp_call.in_progress right after added, and again as a keepalive while the call runs
    (after its arguments; returns 1 for a keepalive); completed / failed after the arguments."""
    if kind == "response.mcp_call.in_progress":
        if item.step == "text_done":
            return 1
        assert item.step == "added", "mcp_call.in_progress out of place"
        item.step = "calling"
        return 0
    assert kind in ("response.mcp_call.completed", "response.mcp_call.failed"), kind
    assert item.step == "text_done", f"{kind} before the arguments are done"
    item.step = "ran_failed" if kind.endswith("failed") else "ran"
    return 0


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
    if item.item["type"] == "mcp_call":
        assert item.step in ("text_done", "ran", "ran_failed"), "closed early"
        return
    assert item.step == ("part_done" if rules.part else "text_done"), "closed early"


def _check_done_item(item: _Open, done: dict[str, Any]) -> None:
    added = item.item
    assert done["id"] == added["id"], "item id changed"
    assert done["type"] == added["type"], "item type changed"
    kind = done["type"]
    if kind == "mcp_call":
        ran = {"ran": "completed", "ran_failed": "failed", "text_done": "incomplete"}
        assert done["status"] == ran[item.step], (done["status"], item.step)
        assert done["arguments"] == item.text, "done arguments differ from the deltas"
        assert (done.get("error") is not None) == (item.step == "ran_failed")
        assert (done.get("output") is not None) == (item.step == "ran")
        return
    assert done["status"] in ("completed", "incomplete")
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
