"""Tool names that are not harmony identifiers are renamed for the model and back."""

from __future__ import annotations

from server.contracts.events import SegmentKind, SegmentStart, ToolTarget
from server.contracts.transcript import (
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.core.tool_names import ToolNames, identifier


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
        ("functions.web_search", ToolTarget("web.search")),
        ("functions.web_search_2", ToolTarget("web-search")),
        ("my_ns.run", ToolTarget("run", "my-ns")),
        ("functions.unknown", ToolTarget("unknown")),
    ):
        event = SegmentStart(0, SegmentKind.TOOL_CALL, "commentary", harmony)
        assert names.to_client(event).target == client  # type: ignore[union-attr]
    choice = names.to_harmony_choice(ToolChoice(mode="named", name="web-search"))
    assert choice.name == "web_search_2"


def test_targets_carry_the_kind_and_namespace_of_the_offered_tool() -> None:
    tools = (
        ToolSpec("f"),
        ToolSpec("apply_patch", kind="custom"),
        ToolSpec("c", namespace="ns", kind="custom"),
    )
    names = ToolNames(tools)
    assert names.target("functions.f") == ToolTarget("f")
    assert names.target("functions.apply_patch") == ToolTarget("apply_patch", kind="custom")
    assert names.target("ns.c") == ToolTarget("c", "ns", "custom")
    assert names.target("functions.unknown") == ToolTarget("unknown")
    assert names.target("container.exec") == ToolTarget("exec", "container")
    # harmony's built-in tools: a bare `python` is the python namespace, `browser.*` the
    # browser's; any other bare name stays in the default namespace
    assert names.target("python") == ToolTarget("python", "python")
    assert names.target("browser.search") == ToolTarget("search", "browser")
    assert names.target("lookup") == ToolTarget("lookup")
    assert ToolTarget("exec", "container").qualified_name == "container.exec"
    assert ToolTarget("f").qualified_name == "f"
