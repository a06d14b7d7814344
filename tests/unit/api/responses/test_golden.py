"""Golden tests: request bodies captured from Codex CLI 0.171 -> adapter -> harmony prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.transcript import ResponseFormat, ToolCall, ToolChoice
from server.harmony.render import render
from tests.support.responses import Translated, translate

DATA = Path(__file__).parents[3] / "data" / "codex"
DATE = "2026-11-21"
MARKER = "SECRET-REASONING-MARKER"


def body(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def planned(name: str) -> Translated:
    return translate(body(name), date=DATE)


def prompt(encoding: HarmonyEncoding, name: str) -> str:
    return encoding.decode_utf8(render(encoding, planned(name).transcript))


def developer_message(text: str) -> str:
    start = text.index("<|start|>developer<|message|>")
    return text[start : text.index("<|end|>", start)]


@pytest.mark.parametrize(
    "name", ["exec_round2", "exec_resumed", "apply_patch_round2", "namespace_round2"]
)
def test_codex_prompt_head(encoding: HarmonyEncoding, name: str) -> None:
    text = prompt(encoding, name)
    assert text.startswith("<|start|>system<|message|>You are ChatGPT")
    assert f"Current date: {DATE}" in text
    assert "Reasoning: low" in text  # Codex's {"effort": "low"}
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text
    assert text.count("<|start|>developer") == 1  # all leading developer text in one message
    developer = developer_message(text)
    base_prompt = body(name)["input"][0]["content"][0]["text"]
    assert developer.startswith(f"<|start|>developer<|message|># Instructions\n\n{base_prompt}")
    instructions = developer[: developer.index("# Tools")]
    assert "<skills_instructions>" in instructions
    assert "<permissions instructions>" in instructions
    assert "## functions\n\nnamespace functions {\n" in developer
    assert "type exec_command = (_: {\n// Shell command to execute.\ncmd: string," in developer
    assert "type write_stdin = (_: {" in developer
    assert "web_search" not in developer  # a hosted tool: accepted, not offered
    assert "<|start|>user<|message|><environment_context>" in text
    assert text.endswith("<|end|><|start|>assistant")


def test_codex_namespace_tools_are_their_own_harmony_namespace(
    encoding: HarmonyEncoding,
) -> None:
    text = prompt(encoding, "exec_round2")
    developer = developer_message(text)
    assert (
        "## multi_agent_v1\n\n// Tools for spawning and managing sub-agents.\n"
        "namespace multi_agent_v1 {\n" in developer
    )
    assert developer.index("## functions") < developer.index("## multi_agent_v1")
    namespace = developer[developer.index("namespace multi_agent_v1 {") :]
    for name in ("close_agent", "resume_agent", "send_input", "spawn_agent", "wait_agent"):
        assert f"type {name} = (" in namespace
        assert f"type {name} = (" not in developer[: developer.index("## multi_agent_v1")]


def test_codex_function_call_round_renders_call_and_output(encoding: HarmonyEncoding) -> None:
    text = prompt(encoding, "exec_round2")
    chain = (
        f"<|start|>user<|message|>Run echo hello-from-tool and then say done.<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>The user wants a trivial task. "
        f"I should answer briefly. {MARKER}-1<|end|>"
        "<|start|>assistant to=functions.exec_command<|channel|>commentary <|constrain|>json"
        '<|message|>{"cmd": "echo hello-from-tool"}<|call|>'
        "<|start|>functions.exec_command to=assistant<|channel|>commentary<|message|>Chunk ID: "
    )
    assert chain in text  # the current tool chain keeps its reasoning
    assert text.endswith("hello-from-tool\n<|end|><|start|>assistant")


def test_codex_resumed_turn_drops_all_finished_reasoning(encoding: HarmonyEncoding) -> None:
    request = body("exec_resumed")
    assert sum(item["type"] == "reasoning" for item in request["input"]) == 2
    text = prompt(encoding, "exec_resumed")
    assert MARKER not in text
    assert "<|channel|>analysis" not in text
    assert "to=functions.exec_command<|channel|>commentary <|constrain|>json" in text
    assert "<|start|>assistant<|channel|>final<|message|>done<|end|>" in text
    assert text.endswith("<|start|>user<|message|>Now say done again.<|end|><|start|>assistant")


def test_codex_apply_patch_is_a_one_string_function_and_its_call_json(
    encoding: HarmonyEncoding,
) -> None:
    planned_request = planned("apply_patch_round2")
    (spec,) = [s for s in planned_request.transcript.tools if s.name == "apply_patch"]
    assert spec.kind == "custom"
    text = prompt(encoding, "apply_patch_round2")
    assert (
        "// The `apply_patch` tool can be used to edit files. This is a FREEFORM tool, so do "
        "not wrap the patch in JSON.\ntype apply_patch = (_: {\n" in text
    )
    declaration = text[text.index("type apply_patch") :]
    assert declaration[: declaration.index("}) => any;")].count("input: string,") == 1
    patch = "*** Begin Patch\\n*** Add File: hello.txt\\n+hello from apply_patch\\n*** End Patch\\n"
    assert (
        "<|start|>assistant to=functions.apply_patch<|channel|>commentary <|constrain|>json"
        f'<|message|>{{"input":"{patch}"}}<|call|>'
        "<|start|>functions.apply_patch to=assistant<|channel|>commentary<|message|>Exit code: 0"
    ) in text


def test_codex_namespaced_call_is_addressed_to_its_namespace(encoding: HarmonyEncoding) -> None:
    text = prompt(encoding, "namespace_round2")
    assert (
        "<|start|>assistant to=multi_agent_v1.close_agent<|channel|>commentary <|constrain|>json"
        '<|message|>{"target": "nonexistent-agent"}<|call|>'
        "<|start|>multi_agent_v1.close_agent to=assistant<|channel|>commentary<|message|>"
        "invalid agent id nonexistent-agent"
    ) in text
    calls = [i for i in planned("namespace_round2").transcript.items if isinstance(i, ToolCall)]
    assert [(c.namespace, c.name, c.call_id) for c in calls] == [
        ("multi_agent_v1", "close_agent", "call_fake001")
    ]


def test_codex_output_schema_becomes_the_response_format() -> None:
    planned_request = planned("output_schema")
    assert planned_request.transcript.response_format == ResponseFormat(
        kind="json_schema",
        name="codex_output_schema",
        schema={
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        strict=True,
    )
    assert planned_request.options.tool_choice == ToolChoice(mode="auto")
    assert planned_request.options.max_tokens is None  # Codex sends none: context-limited
