"""The Responses adapter: request -> Transcript + GenerationOptions, and call shapes back."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from server.api.responses.adapter import (
    custom_arguments,
    custom_input,
    output_items,
    to_items,
    to_tools,
)
from server.contracts.errors import InvalidRequest
from server.contracts.events import SegmentEnd, SegmentKind, ToolTarget
from server.contracts.transcript import (
    AssistantMessage,
    DeveloperMessage,
    Reasoning,
    ResponseFormat,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    UserMessage,
)
from tests.support.responses import Translated, translate

FUNCTION = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def planned(**body: Any) -> Translated:
    return translate(body)


def test_string_input_is_one_user_message() -> None:
    result = planned(input="Hi")
    assert result.transcript.items == (UserMessage("Hi"),)
    assert result.transcript.instructions is None
    assert result.transcript.conversation_date == "2026-01-02"
    assert result.transcript.reasoning_effort == "medium"


def test_leading_developer_and_system_messages_join_the_instructions() -> None:
    result = planned(
        instructions="Be terse.",
        input=[
            {"type": "message", "role": "developer", "content": "Dev one."},
            {"role": "system", "content": [{"type": "input_text", "text": "Sys two."}]},
            {"role": "user", "content": "Hi"},
            {"role": "developer", "content": "Later."},
        ],
    )
    assert result.transcript.instructions == "Be terse.\n\nDev one.\n\nSys two."
    assert result.transcript.items == (UserMessage("Hi"), DeveloperMessage("Later."))
    assert result.conversation[:2] == (DeveloperMessage("Dev one."), DeveloperMessage("Sys two."))


def test_every_item_type_maps_to_its_transcript_item() -> None:
    patch = "*** Begin Patch\n*** End Patch\n"
    items = to_items(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"},
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Think."}],
                "encrypted_content": None,
            },
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "S"}]},
            {
                "type": "message",
                "role": "assistant",
                "phase": "commentary",
                "content": [{"type": "output_text", "text": "Running.", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc"},
            {"type": "function_call_output", "call_id": "c1", "output": "out"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": patch},
            {
                "type": "custom_tool_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "ok"}, {"type": "input_image"}],
            },
            {
                "type": "function_call",
                "call_id": "c3",
                "name": "g",
                "namespace": "ns",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c3", "output": "done"},
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Done."}],
                "phase": "final_answer",
            },
        ]
    )
    assert items == [
        UserMessage("a\nb"),
        Reasoning("Think."),  # the summary-only item carries no CoT and is skipped
        AssistantMessage("Running.", channel="commentary"),
        ToolCall("c1", "f", "{}"),
        ToolResult("c1", "out", "f"),
        ToolCall("c2", "apply_patch", json.dumps({"input": patch}, separators=(",", ":"))),
        ToolResult("c2", "ok\n[input_image omitted]", "apply_patch"),
        ToolCall("c3", "g", "{}", namespace="ns"),
        ToolResult("c3", "done", "g", namespace="ns"),
        AssistantMessage("Done.", channel="final"),
    ]


def test_unknown_item_types_are_skipped_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    items = to_items(
        [
            {"type": "item_reference", "id": "x"},
            {"type": "web_search_call", "id": "ws", "status": "completed"},
            {"role": "user", "content": "Hi", "id": "msg_1", "status": "completed", "extra": 1},
        ]
    )
    assert items == [UserMessage("Hi")]
    assert "input[0]" in caplog.text
    assert "web_search_call" in caplog.text


def test_tool_output_finds_its_call_in_the_earlier_conversation() -> None:
    earlier = (ToolCall("c9", "close_agent", "{}", namespace="multi_agent_v1"),)
    (result,) = to_items(
        [{"type": "function_call_output", "call_id": "c9", "output": "x"}], earlier
    )
    assert result == ToolResult("c9", "x", "close_agent", namespace="multi_agent_v1")


def test_tools_function_custom_namespace_and_hosted() -> None:
    specs = to_tools(
        [
            {**FUNCTION, "description": "F.", "strict": False},
            {
                "type": "custom",
                "name": "apply_patch",
                "description": "Patch.",
                "format": {"type": "grammar"},
            },
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "description": "Agents.",
                "tools": [{"type": "function", "name": "close_agent", "parameters": None}],
            },
            {"type": "web_search", "external_web_access": False},
            {"type": "local_shell"},
            {"type": "image_generation"},
        ]
    )
    assert specs == (
        ToolSpec("f", "F.", {"type": "object"}, strict=False),
        ToolSpec("apply_patch", "Patch.", None, kind="custom"),
        ToolSpec(
            "close_agent", "", None, namespace="multi_agent_v1", namespace_description="Agents."
        ),
    )


def test_options_pass_through() -> None:
    result = planned(
        input="x",
        tools=[FUNCTION],
        tool_choice={"type": "function", "name": "f"},
        max_output_tokens=77,
        temperature=0.5,
        top_p=0.9,
        reasoning={"effort": "xhigh", "summary": "auto"},
        text={"format": {"type": "json_object"}},
    )
    options = result.options
    assert options.max_tokens == 77
    assert (options.temperature, options.top_p) == (0.5, 0.9)
    assert options.tool_choice == ToolChoice(mode="named", name="f")
    assert result.transcript.reasoning_effort == "high"
    assert result.transcript.response_format == ResponseFormat(kind="json_object")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", ToolChoice(mode="none")),
        ("required", ToolChoice(mode="required")),
        ({"type": "custom", "name": "apply_patch"}, ToolChoice(mode="named", name="apply_patch")),
        (
            {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"},
            ToolChoice(mode="named", name="close_agent", namespace="multi_agent_v1"),
        ),
        ({"type": "allowed_tools", "mode": "required", "tools": []}, ToolChoice(mode="required")),
    ],
)
def test_tool_choice_shapes(choice: Any, expected: ToolChoice) -> None:
    assert planned(input="x", tool_choice=choice).options.tool_choice == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        (
            {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "custom"}]}]},
            "tools[0].tools[0].name",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input[0].call_id",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0]",
        ),
    ],
)
def test_bad_requests_name_their_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        planned(**{"input": "x", **body})
    assert raised.value.param == param


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"input": "*** Begin Patch\\n"}', "*** Begin Patch\n"),
        ("*** Begin Patch\n+raw\n", "*** Begin Patch\n+raw\n"),  # raw text passes through
        ('{"patch": "x"}', '{"patch": "x"}'),
        ('{"input": 3}', '{"input": 3}'),
        ('"just a string"', '"just a string"'),
    ],
)
def test_custom_input(arguments: str, expected: str) -> None:
    assert custom_input(arguments) == expected


def test_custom_arguments_round_trip() -> None:
    text = 'line "one"\nü\n'
    assert custom_input(custom_arguments(text)) == text


def test_output_items_carry_prompt_ready_tokens() -> None:
    start = (200006, 173781)  # <|start|>assistant
    ends = [
        SegmentEnd(0, SegmentKind.REASONING, "R", (200005, 1, 200008, 2, 200007)),
        SegmentEnd(
            1,
            SegmentKind.TOOL_CALL,
            '{"input":"p"}',
            (200006, 173781, 200005, 3, 200008, 4, 200012),
            recipient="functions.apply_patch",
            content_type="<|constrain|>json",
            call_id="call_1",
            target=ToolTarget("apply_patch", kind="custom"),
        ),
        SegmentEnd(2, SegmentKind.FINAL, "A", (200006, 173781, 5, 200002)),
        SegmentEnd(3, SegmentKind.PREAMBLE, "cut", (200006, 173781, 6), complete=False),
    ]
    assert output_items(ends, start) == [
        Reasoning("R", tokens=(200006, 173781, 200005, 1, 200008, 2, 200007)),
        ToolCall(
            "call_1",
            "apply_patch",
            '{"input":"p"}',
            content_type="<|constrain|>json",
            tokens=(200006, 173781, 200005, 3, 200008, 4, 200012),
        ),
        AssistantMessage("A", tokens=(200006, 173781, 5, 200007)),
        AssistantMessage("cut", channel="commentary"),
    ]


def test_a_custom_call_cut_short_is_unwrapped_as_far_as_it_was_written() -> None:
    assert custom_input('{"input":"*** Begin Patch\\n*** Add File: a') == (
        "*** Begin Patch\n*** Add File: a"
    )
    assert custom_input('{"input":"tab\\t and a cut escape \\u00') == "tab\t and a cut escape "
    assert custom_input('{"input":"ends on a backslash \\') == "ends on a backslash "
    assert custom_input('{"input":"') == ""
    assert custom_input("not json at all") == "not json at all"
    assert custom_input('{"input":"done"}') == "done"
