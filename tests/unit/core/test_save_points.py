"""Prompt cache on disk: where a prompt is worth saving (the core's save points) and settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.transcript import AssistantMessage, ToolSpec, Transcript, UserMessage
from server.core.save_points import SavePoints
from server.harmony.render import render
from server.harmony.tokens import END, START
from server.ops.settings import Settings
from server.ops.startup import engine_config

TOOLS = (ToolSpec("ls", "List files.", {"type": "object", "properties": {}}),)


def points(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
    prompt = render(encoding, transcript)
    return [*SavePoints.of(encoding)(prompt)]


def test_the_instructions_end_and_the_last_user_text_start(encoding: HarmonyEncoding) -> None:
    first, last = UserMessage("Environment: /repo"), UserMessage("Fix the bug.")
    reply = AssistantMessage("Done.", channel="final")
    transcript = Transcript(items=(first, reply, last), instructions="Be brief.", tools=TOOLS)
    prompt = render(encoding, transcript)
    head, user_text = points(encoding, transcript)
    # the developer message (instructions + tools) ends right before `head`
    assert prompt[head - 1] == END
    assert encoding.decode(prompt[:head]).rstrip().endswith("<|end|>")
    assert "<|start|>developer" in encoding.decode(prompt[:head])
    assert "Environment" not in encoding.decode(prompt[:head])
    # the last user message's text starts at `user_text`
    assert encoding.decode(prompt[user_text:]).startswith("Fix the bug.<|end|>")
    assert encoding.decode(prompt[user_text - 3 : user_text]) == "<|start|>user<|message|>"


def test_without_a_developer_message_the_system_message_is_the_head(
    encoding: HarmonyEncoding,
) -> None:
    transcript = Transcript(items=(UserMessage("Hi."),))
    prompt = render(encoding, transcript)
    head, user_text = points(encoding, transcript)
    assert prompt[head - 1] == END
    assert prompt[head] == START
    assert prompt[:head].count(END) == 1
    assert user_text == head + 3


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPT_OSS_PROMPT_CACHE", "GPT_OSS_PROMPT_CACHE_DIR", "GPT_OSS_PROMPT_CACHE_GB"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_env")
def test_settings_default_on_under_xdg_cache_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    settings = Settings()
    config = engine_config(settings, Path("model.gguf"))
    assert config.prompt_cache_dir == str(tmp_path / "gpt-oss-server" / "kv")
    assert config.prompt_cache_bytes == 8 * 1024**3


@pytest.mark.usefixtures("no_env")
def test_settings_off_and_budget() -> None:
    assert engine_config(Settings(prompt_cache=False), Path("m.gguf")).prompt_cache_dir is None
    config = engine_config(Settings(prompt_cache_gb=0.5), Path("m.gguf"))
    assert config.prompt_cache_bytes == 512 * 1024**2
