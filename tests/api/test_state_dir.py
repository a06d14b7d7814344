"""The state directory at start-up: checked like ssh's, and the thinking-signature key kept
there so that Claude Code's thinking blocks outlive a restart of the server."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from server.app import create_app
from server.contracts.errors import StartupError
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.root import require_root

pytestmark = pytest.mark.skipif(os.name != "posix", reason="owners and modes are POSIX")

MODEL = "gpt-oss-tiny"
TOOL = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_CALL = (
    "<|channel|>analysis<|message|>Need the weather for Paris first.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Paris"}<|call|>'
)
OMITTED = {"type": "adaptive", "display": "omitted"}


def settings(state: Path, **more: Any) -> Settings:
    return Settings(responses_store_path=state / "responses.sqlite3", **more)


def tool_round(client: TestClient, forced: ForcedScript) -> list[dict[str, Any]]:
    """A tool call with its thinking omitted (Claude Code's default): the next request's
    messages, the thinking block sent back as the text-less block with its signature."""
    forced.push(WEATHER_CALL)
    first = {"role": "user", "content": "Weather in Paris?"}
    body = {"model": MODEL, "max_tokens": 100, "messages": [first], "tools": [TOOL]}
    response = client.post("/v1/messages", json={**body, "thinking": OMITTED})
    assert response.status_code == 200, response.text
    content = response.json()["content"]
    thinking, call = content[0], content[-1]
    assert thinking["type"] == "thinking"
    assert thinking["thinking"] == ""
    assert thinking["signature"]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny"}
    return [first, {"role": "assistant", "content": content}, {"role": "user", "content": [result]}]


def count(client: TestClient, messages: list[dict[str, Any]]) -> int:
    body = {"model": MODEL, "messages": messages, "tools": [TOOL], "thinking": OMITTED}
    response = client.post("/v1/messages/count_tokens", json=body)
    assert response.status_code == 200, response.text
    return int(response.json()["input_tokens"])


def test_thinking_signatures_survive_a_restart(
    runtime: Runtime, forced: ForcedScript, tmp_path: Path
) -> None:
    with TestClient(create_app(settings(tmp_path / "state"), runtime)) as before:
        messages = tool_round(before, forced)
        tokens_before = count(before, messages)
    key = tmp_path / "state" / "thinking-signature.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_bytes()) == 32

    with TestClient(create_app(settings(tmp_path / "state"), runtime)) as after:  # restarted
        thinking = messages[1]["content"][0]
        signer = after.app.state.messages.signer  # type: ignore[attr-defined]
        assert signer.verify(thinking["thinking"], thinking["signature"])
        # the omitted thinking is restored from its signature's tokens, as before the restart
        assert count(after, messages) == tokens_before

    with TestClient(create_app(settings(tmp_path / "other"), runtime)) as elsewhere:
        assert count(elsewhere, messages) < tokens_before  # another key: the block is dropped


def test_a_state_directory_others_may_write_is_refused_at_start_up(
    runtime: Runtime, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    with pytest.raises(StartupError, match=f"directory {state} has mode 0777"):
        create_app(settings(state), runtime)


def test_a_key_file_others_may_read_is_refused_at_start_up(
    runtime: Runtime, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    key = state / "thinking-signature.key"
    key.write_bytes(os.urandom(32))
    os.chmod(key, 0o644)
    with pytest.raises(StartupError, match=f"file {key} has mode 0644"):
        create_app(settings(state), runtime)
    os.chmod(key, 0o600)
    key.write_bytes(b"short")
    with pytest.raises(StartupError, match="does not hold a 32-byte key"):
        create_app(settings(state), runtime)


def test_a_state_directory_of_another_user_is_refused_at_start_up(
    runtime: Runtime, tmp_path: Path
) -> None:
    require_root("giving a directory to another user needs root")
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chown(state, 65534, 65534)
    with pytest.raises(StartupError, match="belongs to another user"):
        create_app(settings(state), runtime)
