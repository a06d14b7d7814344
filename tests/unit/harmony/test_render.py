"""render(): Transcript -> harmony prompt tokens, checked against harmony's own renderer."""

from __future__ import annotations

import dataclasses

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
)

from server.contracts.transcript import (
    AssistantMessage,
    BuiltinTool,
    Reasoning,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.harmony.render import render, visible_items
from server.harmony.renderer import Renderer, Renders

WEATHER = ToolSpec(
    name="get_weather",
    description="Get the weather.",
    parameters={
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City"}},
        "required": ["location"],
    },
)


def _text(encoding: HarmonyEncoding, tokens: list[int]) -> str:
    return encoding.decode_utf8(tokens)


def test_simple_prompt_matches_harmony_conversation_render(encoding: HarmonyEncoding) -> None:
    transcript = Transcript(
        items=(UserMessage("Hi"),),
        instructions="Be terse.",
        reasoning_effort="low",
        conversation_date="2026-11-21",
    )
    expected = encoding.render_conversation_for_completion(
        Conversation.from_messages(
            [
                Message.from_role_and_content(
                    Role.SYSTEM,
                    SystemContent.new()
                    .with_reasoning_effort(ReasoningEffort.LOW)
                    .with_conversation_start_date("2026-11-21"),
                ),
                Message.from_role_and_content(
                    Role.DEVELOPER, DeveloperContent.new().with_instructions("Be terse.")
                ),
                Message.from_role_and_content(Role.USER, "Hi"),
            ]
        ),
        Role.ASSISTANT,
    )
    assert render(encoding, transcript) == expected
    text = _text(encoding, expected)
    assert "Reasoning: low" in text
    assert "Current date: 2026-11-21" in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


def test_no_developer_message_without_instructions_or_tools(encoding: HarmonyEncoding) -> None:
    text = _text(encoding, render(encoding, Transcript(items=(UserMessage("Hi"),))))
    assert "<|start|>developer" not in text
    assert "Reasoning: medium" in text


def test_tool_loop_matches_harmony_and_keeps_current_chain_reasoning(
    encoding: HarmonyEncoding,
) -> None:
    transcript = Transcript(
        items=(
            UserMessage("Weather in SF?"),
            Reasoning("Need to call get_weather."),
            ToolCall(call_id="c1", name="get_weather", arguments='{"location":"SF"}'),
            ToolResult(call_id="c1", name="get_weather", output='{"sunny":true}'),
        ),
        tools=(WEATHER,),
        reasoning_effort="high",
    )
    tool = ToolDescription.new("get_weather", "Get the weather.", parameters=WEATHER.parameters)
    messages = [
        Message.from_role_and_content(
            Role.SYSTEM, SystemContent.new().with_reasoning_effort(ReasoningEffort.HIGH)
        ),
        Message.from_role_and_content(
            Role.DEVELOPER, DeveloperContent.new().with_function_tools([tool])
        ),
        Message.from_role_and_content(Role.USER, "Weather in SF?"),
        Message.from_role_and_content(Role.ASSISTANT, "Need to call get_weather.").with_channel(
            "analysis"
        ),
        Message.from_role_and_content(Role.ASSISTANT, '{"location":"SF"}')
        .with_channel("commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json"),
        Message.from_author_and_content(
            Author.new(Role.TOOL, "functions.get_weather"), '{"sunny":true}'
        )
        .with_channel("commentary")
        .with_recipient("assistant"),
    ]
    expected = encoding.render_conversation_for_completion(
        Conversation.from_messages(messages),
        Role.ASSISTANT,
        RenderConversationConfig(auto_drop_analysis=False),
    )
    prompt = render(encoding, transcript)
    assert prompt == expected
    text = _text(encoding, prompt)
    assert "<|channel|>analysis<|message|>Need to call get_weather.<|end|>" in text
    assert "to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>" in text
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>" in text
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text


def test_reasoning_before_last_final_is_dropped(encoding: HarmonyEncoding) -> None:
    items = (
        UserMessage("one"),
        Reasoning("first thought"),
        AssistantMessage("answer one"),
        UserMessage("two"),
        Reasoning("second thought"),
        ToolCall(call_id="c", name="get_weather", arguments="{}"),
        ToolResult(call_id="c", name="get_weather", output="ok"),
        Reasoning("third thought"),
        AssistantMessage("answer two"),
        UserMessage("three"),
    )
    kept = visible_items(items)
    assert [i for i in kept if isinstance(i, Reasoning)] == []
    assert len(kept) == len(items) - 3
    text = _text(encoding, render(encoding, Transcript(items=items, tools=(WEATHER,))))
    assert "thought" not in text
    assert "answer one" in text
    assert "answer two" in text


def test_reasoning_of_unfinished_turn_survives_earlier_finals(encoding: HarmonyEncoding) -> None:
    items = (
        UserMessage("one"),
        Reasoning("old"),
        AssistantMessage("done"),
        UserMessage("two"),
        Reasoning("current"),
        AssistantMessage("Checking.", channel="commentary"),
        ToolCall(call_id="c", name="get_weather", arguments="{}"),
        ToolResult(call_id="c", name="get_weather", output="ok"),
    )
    text = _text(encoding, render(encoding, Transcript(items=items, tools=(WEATHER,))))
    assert "old" not in text
    assert "<|channel|>analysis<|message|>current<|end|>" in text
    assert "<|channel|>commentary<|message|>Checking.<|end|>" in text


def test_exact_tokens_are_replayed_verbatim(encoding: HarmonyEncoding) -> None:
    sampled = encoding.encode(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"location": "SF"}<|call|>',
        allowed_special="all",
    )
    call = ToolCall(
        call_id="c", name="get_weather", arguments='{"location":"SF"}', tokens=tuple(sampled)
    )
    prompt = render(encoding, Transcript(items=(UserMessage("x"), call), tools=(WEATHER,)))
    tail = prompt[-len(sampled) - 2 : -2]
    assert tail == sampled


def test_namespaces_render_after_functions(encoding: HarmonyEncoding) -> None:
    tools = (
        ToolSpec(name="close_agent", namespace="multi_agent_v1", namespace_description="Agents."),
        WEATHER,
    )
    text = _text(encoding, render(encoding, Transcript(items=(UserMessage("x"),), tools=tools)))
    functions_at = text.index("namespace functions {")
    agents_at = text.index("namespace multi_agent_v1 {")
    assert functions_at < agents_at
    assert "// Agents." in text
    assert "type close_agent = () => any;" in text


def test_custom_tools_take_one_string(encoding: HarmonyEncoding) -> None:
    patch = ToolSpec(name="apply_patch", description="Edit files.", kind="custom")
    text = _text(encoding, render(encoding, Transcript(items=(UserMessage("x"),), tools=(patch,))))
    assert (
        "// Edit files.\ntype apply_patch = (_: {\n// The tool's raw text input, exactly as its "
        "description asks for it (passed on unchanged, never parsed as JSON).\n"
        "input: string,\n}) => any;" in text
    )


def _harmony_render(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
    """harmony's own render of a transcript of user messages with function tools."""
    efforts = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM}
    system = SystemContent.new().with_reasoning_effort(efforts[transcript.reasoning_effort])
    if transcript.conversation_date:
        system = system.with_conversation_start_date(transcript.conversation_date)
    developer = DeveloperContent.new().with_instructions(transcript.instructions or "")
    developer = developer.with_function_tools(
        [
            ToolDescription.new(s.name, s.description, parameters=s.parameters)
            for s in transcript.tools
        ]
    )
    messages = [
        Message.from_role_and_content(Role.SYSTEM, system),
        Message.from_role_and_content(Role.DEVELOPER, developer),
        *(
            Message.from_role_and_content(Role.USER, item.text)
            for item in transcript.items
            if isinstance(item, UserMessage)
        ),
    ]
    return encoding.render_conversation_for_completion(
        Conversation.from_messages(messages), Role.ASSISTANT
    )


def test_remembered_renders_follow_every_input(encoding: HarmonyEncoding) -> None:
    """Renders are remembered across requests; a change to anything the system, developer or
    item messages are rendered from gives that change's render, never a remembered one."""
    base = Transcript(
        items=(UserMessage("Hi"), UserMessage("And the weather?")),
        instructions="Be terse.",
        tools=(WEATHER,),
        reasoning_effort="low",
        conversation_date="2026-11-21",
    )
    city, unit = {"type": "string"}, {"type": "string", "enum": ["C", "F"]}
    two = dataclasses.replace(
        WEATHER, parameters={"type": "object", "properties": {"city": city, "unit": unit}}
    )
    swapped = {"type": "object", "properties": {"unit": unit, "city": city}}  # other key order
    variants = [
        base,
        dataclasses.replace(base, instructions="Be verbose."),
        dataclasses.replace(base, reasoning_effort="medium"),
        dataclasses.replace(base, conversation_date="2026-11-22"),
        dataclasses.replace(base, tools=(dataclasses.replace(WEATHER, description="Weather."),)),
        dataclasses.replace(base, tools=(two,)),
        dataclasses.replace(base, tools=(dataclasses.replace(two, parameters=swapped),)),
        dataclasses.replace(base, items=(UserMessage("Hi"), UserMessage("And the time?"))),
    ]
    renderer = Renderer(encoding)
    renders = [renderer.render(v) for v in variants]
    assert len({tuple(r) for r in renders}) == len(variants)
    for variant, first in zip(variants, renders, strict=True):
        assert first == _harmony_render(encoding, variant) == render(encoding, variant)
        again = renderer.render(variant)
        assert again == first
        again.append(0)  # the caller's list is its own: the remembered render is unchanged
        assert renderer.render(variant) == first


def test_the_renderer_forgets_the_least_recently_used_beyond_its_budget() -> None:
    renders = Renders(max_tokens=10)
    made: list[str] = []

    def make(name: str, n: int) -> list[int]:
        made.append(name)
        return list(range(n))

    assert renders.get("a", lambda: make("a", 4)) == (0, 1, 2, 3)
    renders.get("b", lambda: make("b", 4))
    renders.get("a", lambda: make("a", 4))  # remembered; now the most recently used
    renders.get("c", lambda: make("c", 4))  # 12 tokens: b goes
    renders.get("a", lambda: make("a", 4))
    renders.get("b", lambda: make("b", 4))
    renders.get("d", lambda: make("d", 11))  # larger than the budget: returned, not kept
    renders.get("d", lambda: make("d", 11))
    assert made == ["a", "b", "c", "b", "d", "d"]


def test_builtin_tools_render_in_the_system_message_as_harmony_does(
    encoding: HarmonyEncoding,
) -> None:
    """harmony's own python and browser namespaces, in the system message; python with the
    server's description when it has one."""
    plain = Transcript(
        items=(UserMessage("hi"),),
        builtin_tools=(BuiltinTool("browser"), BuiltinTool("python")),
    )
    system = SystemContent.new().with_browser_tool().with_python_tool()
    expected = encoding.render_conversation(
        Conversation.from_messages(
            [
                Message.from_role_and_content(Role.SYSTEM, system),
                Message.from_role_and_content(Role.USER, "hi"),
            ]
        )
    )
    assert render(encoding, plain)[: len(expected)] == expected
    described = dataclasses.replace(
        plain, builtin_tools=(BuiltinTool("python", "Run code here. No network."),)
    )
    text = _text(encoding, render(encoding, described))
    assert "## python\n\nRun code here. No network.\n\n" in text
    assert "## browser" not in text
    assert "<|start|>developer" not in text  # no developer message for built-in tools alone


def test_a_builtin_tools_result_replays_on_its_channel_under_its_bare_name(
    encoding: HarmonyEncoding,
) -> None:
    items = (
        UserMessage("run"),
        ToolCall("call_1", "python", "print(1)", "python", "code"),
        ToolResult("call_1", "1\n", "python", "python", channel="analysis"),
    )
    text = _text(encoding, render(encoding, Transcript(items=items)))
    assert "<|start|>assistant to=python<|channel|>commentary code<|message|>print(1)" in text
    assert "<|start|>python to=assistant<|channel|>analysis<|message|>1\n<|end|>" in text
