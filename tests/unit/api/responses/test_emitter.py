"""ResponsesEmitter: generation events -> stream events, checked by the grammar checker."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest

from server.api.responses.emitter import ResponsesEmitter, fold
from server.api.responses.items import ItemKind
from server.api.responses.schemas import ResponseCreated, ResponseInProgress, ResponseObject
from server.api.sse import SharedField, sse_typed
from server.contracts.events import (
    DecodeWarning,
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
    ToolOutput,
    ToolTarget,
    Usage,
)
from server.contracts.transcript import ToolSpec
from server.core.tool_names import ToolNames
from tests.support.event_grammar import CheckedStream, check_stream

USAGE = Usage(prompt_tokens=100, cached_tokens=60, completion_tokens=20, reasoning_tokens=7)
TOOLS = (
    ToolSpec("exec_command"),
    ToolSpec("apply_patch", kind="custom"),
    ToolSpec("close_agent", namespace="multi_agent_v1"),
)


def segment(
    index: int,
    kind: SegmentKind,
    parts: Sequence[str],
    *,
    recipient: str | None = None,
    complete: bool = True,
) -> list[GenerationEvent]:
    call_id = f"call_{index}" if kind is SegmentKind.TOOL_CALL else None
    events: list[GenerationEvent] = [
        SegmentStart(index, kind, "x", recipient=recipient, call_id=call_id)
    ]
    events += [SegmentDelta(index, kind, part) for part in parts]
    events.append(
        SegmentEnd(
            index, kind, "".join(parts), (1,), complete, recipient=recipient, call_id=call_id
        )
    )
    return events


def emit(events: Sequence[GenerationEvent], tools: Sequence[ToolSpec] = TOOLS) -> CheckedStream:
    counter = itertools.count()
    emitter = ResponsesEmitter(
        ResponseObject(id="resp_1", created_at=1, model="m"),
        new_item_id=lambda prefix: f"{prefix}{next(counter)}",
    )
    names = ToolNames(tools)  # the core gives tool calls their targets
    out = emitter.start()
    for event in events:
        out += emitter.feed(names.to_client(event))
    assert emitter.feed(Finished(FinishReason.STOP)) == []  # nothing after the terminal event
    checked = check_stream([e.model_dump(mode="json") for e in out])
    assert fold(out).model_dump(mode="json") == checked.terminal["response"]
    return checked


def test_reasoning_then_answer() -> None:
    checked = emit(
        [
            *segment(0, SegmentKind.REASONING, ["User ", "asks."]),
            *segment(1, SegmentKind.FINAL, ["2 + 2", " = 4."]),
            Finished(FinishReason.STOP, USAGE),
        ]
    )
    assert checked.types() == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    reasoning, message = checked.items
    assert reasoning == {
        "type": "reasoning",
        "id": "rs_0",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "User asks."}],
        "status": "completed",
    }  # no `encrypted_content`: Open Responses allows it absent, not null
    assert message["phase"] == "final_answer"
    response = checked.response
    assert response.status == "completed"
    assert response.output_text == "2 + 2 = 4."
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 60
    assert response.usage.output_tokens_details.reasoning_tokens == 7
    assert response.usage.total_tokens == 120


def test_function_calls_each_get_added_deltas_done() -> None:
    checked = emit(
        [
            *segment(0, SegmentKind.PREAMBLE, ["Running it."]),
            *segment(
                1, SegmentKind.TOOL_CALL, ['{"cmd":', '"ls"}'], recipient="functions.exec_command"
            ),
            *segment(
                2, SegmentKind.TOOL_CALL, ['{"target":"a"}'], recipient="multi_agent_v1.close_agent"
            ),
            Finished(FinishReason.TOOL_CALL, USAGE),
        ]
    )
    preamble, call, namespaced = checked.items
    assert preamble["phase"] == "commentary"
    assert call == {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "exec_command",
        "arguments": '{"cmd":"ls"}',
        "status": "completed",
    }
    assert namespaced["name"] == "close_agent"
    assert namespaced["namespace"] == "multi_agent_v1"
    deltas = [e for e in checked.events if e["type"] == "response.function_call_arguments.delta"]
    assert [(e["item_id"], e["delta"]) for e in deltas] == [
        ("fc_1", '{"cmd":'),
        ("fc_1", '"ls"}'),
        ("fc_2", '{"target":"a"}'),
    ]


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (['{"input":"*** Begin', ' Patch\\n"}'], "*** Begin Patch\n"),
        (["*** Begin Patch\n", "raw\n"], "*** Begin Patch\nraw\n"),
    ],
)
def test_custom_tool_call_carries_the_raw_input(parts: list[str], expected: str) -> None:
    checked = emit(
        [
            *segment(0, SegmentKind.TOOL_CALL, parts, recipient="functions.apply_patch"),
            Finished(FinishReason.TOOL_CALL, USAGE),
        ]
    )
    (call,) = checked.items
    assert call["type"] == "custom_tool_call"
    assert call["name"] == "apply_patch"
    assert call["input"] == expected
    assert "namespace" not in call
    assert checked.types()[2:6] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]


def test_length_is_incomplete_and_cut_items_are_incomplete() -> None:
    checked = emit(
        [
            *segment(0, SegmentKind.FINAL, ["one two"], complete=False),
            Finished(FinishReason.LENGTH, USAGE),
        ]
    )
    assert checked.types()[-1] == "response.incomplete"
    assert checked.items[0]["status"] == "incomplete"
    assert checked.response.incomplete_details is not None


@pytest.mark.parametrize(
    ("reason", "status"), [(FinishReason.ERROR, "failed"), (FinishReason.CANCELLED, "cancelled")]
)
def test_errors_fail_the_response_and_close_the_open_item(
    reason: FinishReason, status: str
) -> None:
    events: list[GenerationEvent] = [
        SegmentStart(0, SegmentKind.REASONING, "analysis"),
        SegmentDelta(0, SegmentKind.REASONING, "Thinking"),
        Finished(reason, USAGE, error="boom"),
    ]
    checked = emit(events)
    assert checked.types()[-1] == "response.failed"
    assert checked.items[0]["status"] == "incomplete"
    assert checked.items[0]["content"][0]["text"] == "Thinking"
    response = checked.terminal["response"]
    assert response["status"] == status
    assert response["error"]["code"] == "server_error"
    assert "boom" in response["error"]["message"]


def test_warnings_and_stray_events_do_not_break_the_grammar() -> None:
    checked = emit(
        [
            SegmentDelta(7, SegmentKind.FINAL, "orphan"),  # no open item: ignored
            *segment(0, SegmentKind.FINAL, ["Hi"]),
            DecodeWarning("model output left the harmony format", text="stray"),
            SegmentEnd(5, SegmentKind.FINAL, "late", (1,)),  # not the open segment: ignored
            Finished(FinishReason.STOP, USAGE),
        ]
    )
    assert [item["content"][0]["text"] for item in checked.items] == ["Hi"]


def test_a_new_segment_closes_an_unfinished_one() -> None:
    checked = emit(
        [
            SegmentStart(0, SegmentKind.REASONING, "analysis"),
            SegmentDelta(0, SegmentKind.REASONING, "cut"),
            *segment(1, SegmentKind.FINAL, ["Hi"]),
            Finished(FinishReason.STOP, USAGE),
        ]
    )
    assert [item["status"] for item in checked.items] == ["incomplete", "completed"]


def test_keepalive_events_only_between_items() -> None:
    emitter = ResponsesEmitter(ResponseObject(id="resp_1", created_at=1, model="m"))
    out = [*emitter.start(), *emitter.keepalive(), *emitter.keepalive()]
    start, delta, end = segment(0, SegmentKind.FINAL, ["Hi"])
    out += emitter.feed(start)
    assert emitter.keepalive() == []  # never inside an item
    out += [*emitter.feed(delta), *emitter.feed(end), *emitter.keepalive()]
    out += emitter.feed(Finished(FinishReason.STOP, USAGE))
    assert emitter.keepalive() == []  # nor after the end
    checked = check_stream([e.model_dump(mode="json") for e in out])
    assert checked.keepalives == 3
    last_keepalive: dict[str, Any] = checked.events[-2]
    assert last_keepalive["type"] == "response.in_progress"
    assert last_keepalive["response"]["output"] == checked.items  # the snapshot so far


def test_fold_requires_exactly_one_terminal_event() -> None:
    emitter = ResponsesEmitter(ResponseObject(id="resp_1", created_at=1, model="m"))
    with pytest.raises(RuntimeError, match="terminal"):
        fold(emitter.start())


BUILTIN_ITEMS: dict[str, ItemKind] = {
    "python": "code_interpreter_call",
    "browser": "web_search_call",
}


def builtin_emit(events: Sequence[GenerationEvent]) -> CheckedStream:
    """The emitter of a response offering the python and browser tools (run by the server)."""
    emitter = ResponsesEmitter(
        ResponseObject(id="resp_1", created_at=1, model="m"),
        call_kind=lambda target: BUILTIN_ITEMS.get(target.namespace),
        container_id="cntr_1",
    )
    names = ToolNames(())
    out = emitter.start()
    for event in events:
        out += emitter.feed(names.to_client(event))
    checked = check_stream([e.model_dump(mode="json") for e in out])
    assert fold(out).model_dump(mode="json") == checked.terminal["response"]
    return checked


def test_a_python_run_that_could_not_run_fails_without_completed() -> None:
    checked = builtin_emit(
        [
            *segment(0, SegmentKind.TOOL_CALL, ["print(", "1)"], recipient="python"),
            ToolOutput(0, "call_0", ToolTarget("python", "python"), "print(1)", "busy", True),
            *segment(1, SegmentKind.TOOL_CALL, ["1 / 0"], recipient="python"),
            ToolOutput(
                1,
                "call_1",
                ToolTarget("python", "python"),
                "1 / 0",
                "ZeroDivisionError",
                True,
                {"outputs": [{"type": "logs", "logs": "ZeroDivisionError"}]},
            ),
            *segment(2, SegmentKind.TOOL_CALL, ["x ="], recipient="python", complete=False),
            Finished(FinishReason.LENGTH, USAGE),
        ]
    )
    busy, raised, cut = checked.items
    assert (busy["status"], busy["outputs"], busy["code"]) == ("failed", None, "print(1)")
    # code that raised still ran: its traceback is its output
    assert raised["status"] == "completed"
    assert raised["outputs"] == [{"type": "logs", "logs": "ZeroDivisionError"}]
    assert cut["status"] == "incomplete"
    assert {item["container_id"] for item in checked.items} == {"cntr_1"}
    assert checked.types().count("response.code_interpreter_call.completed") == 1
    assert checked.types().count("response.code_interpreter_call.interpreting") == 3


def test_a_browser_call_shows_its_action() -> None:
    action = {"type": "open_page", "url": "https://example.org/"}
    checked = builtin_emit(
        [
            *segment(0, SegmentKind.TOOL_CALL, ['{"id": 1}'], recipient="browser.open"),
            ToolOutput(
                0, "call_0", ToolTarget("open", "browser"), "{}", "page", False, {"action": action}
            ),
            *segment(1, SegmentKind.FINAL, ["done"]),
            Finished(FinishReason.STOP, USAGE),
        ]
    )
    call, _message = checked.items
    assert (call["type"], call["status"], call["action"]) == (
        "web_search_call",
        "completed",
        action,
    )
    added = next(e for e in checked.events if e["type"] == "response.output_item.added")
    assert added["item"]["action"] == {"type": "open_page"}  # known from the function called


def test_the_shared_snapshot_is_encoded_once_and_every_event_as_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two opening events carry one snapshot: its JSON is made once, and every event of the
    stream encodes to the same event name and JSON as sse_typed gives it alone."""
    # a long snapshot, as Codex CLI's, with characters line readers break on (escaped)
    instructions = "Follow the rules.\n\u2028\x85" * 500
    emitter = ResponsesEmitter(
        ResponseObject(id="resp_1", created_at=1, model="m", instructions=instructions)
    )
    out = [*emitter.start(), *emitter.keepalive()]
    for event in segment(0, SegmentKind.FINAL, ["Hi", " there"]):
        out += emitter.feed(event)
    out += emitter.feed(Finished(FinishReason.STOP, USAGE))
    dumps: list[int] = []
    dump = ResponseObject.model_dump_json

    def counted(self: ResponseObject, **kwargs: Any) -> str:
        dumps.append(id(self))
        return dump(self, **kwargs)

    alone = [sse_typed(event) for event in out]
    monkeypatch.setattr(ResponseObject, "model_dump_json", counted)
    shared = SharedField("response")
    encoded = [shared(event) for event in out]
    snapshots = [id(e.response) for e in out if isinstance(e, ResponseCreated | ResponseInProgress)]
    assert snapshots[0] == snapshots[1]  # the opening events' one snapshot
    assert sorted(dumps) == sorted({id(e.response) for e in out if hasattr(e, "response")})
    for one, other in zip(alone, encoded, strict=True):
        name, data = (line for line in one.decode().splitlines() if line)
        assert other.decode().splitlines()[0] == name
        assert json.loads(other.decode().splitlines()[1][6:]) == json.loads(data[6:])
