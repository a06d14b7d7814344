"""Tool names that are not harmony identifiers are renamed for the model and back."""

from __future__ import annotations

from server.events import SegmentKind, SegmentStart
from server.tool_names import ToolNames, identifier
from server.transcript import ToolCall, ToolChoice, ToolResult, ToolSpec, Transcript, UserMessage


def test_identifiers() -> None:
    assert identifier("get_weather") == "get_weather"
    assert identifier("my-tool.v2") == "my_tool_v2"
    assert identifier("search the web") == "search_the_web"
    assert identifier("3d-render") == "_3d_render"
    assert identifier("") == "_"


def test_valid_names_are_untouched() -> None:
    transcript = Transcript(items=(UserMessage("x"),), tools=(ToolSpec("get_weather"),))
    names = ToolNames(transcript.tools)
    assert not names.renamed
    assert names.to_harmony(transcript) is transcript


def test_round_trip_with_collisions() -> None:
    tools = (ToolSpec("web.search"), ToolSpec("web-search"), ToolSpec("run", namespace="my-ns"))
    history = (
        ToolCall(call_id="c1", name="web-search", arguments="{}"),
        ToolResult(call_id="c1", name="web-search", output="ok"),
    )
    names = ToolNames(tools)
    seen = names.to_harmony(Transcript(items=history, tools=tools))
    assert [t.recipient for t in seen.tools] == [
        "functions.web_search",
        "functions.web_search_2",
        "my_ns.run",
    ]
    call, result = seen.items
    assert isinstance(call, ToolCall)
    assert isinstance(result, ToolResult)
    assert call.recipient == result.author == "functions.web_search_2"
    for harmony, client in (
        ("functions.web_search", "functions.web.search"),
        ("functions.web_search_2", "functions.web-search"),
        ("my_ns.run", "my-ns.run"),
        ("functions.unknown", "functions.unknown"),
    ):
        event = SegmentStart(0, SegmentKind.TOOL_CALL, "commentary", harmony)
        assert names.to_client(event).recipient == client  # type: ignore[union-attr]
    choice = names.to_harmony_choice(ToolChoice(mode="named", name="web-search"))
    assert choice.name == "web_search_2"
