"""The private state directory across real `gpt-oss-server serve` processes: the signing key
outlives a restart (Claude Code's thinking blocks still replay), the files are private, and a
state directory others may write stops the start with a clear error."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from devkit.serving import free_port, server_process
from server.api.messages.signature import KEY_FILE, ThinkingSigner
from server.bench.procs import ServerProcess, serve_command

pytestmark = [
    pytest.mark.slow,  # starts and restarts `gpt-oss-server serve` processes
    pytest.mark.skipif(os.name != "posix", reason="owners and modes are POSIX"),
]

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
REASONING = "<|start|>assistant<|channel|>analysis<|message|>Need the weather first.<|end|>"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def count(server: ServerProcess, signature: str) -> int:
    """count_tokens of a tool round whose thinking came back text-less (`display: omitted`)."""
    thinking = {"type": "thinking", "thinking": "", "signature": signature}
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
    body: dict[str, Any] = {
        "model": "gpt-oss-tiny",
        "tools": [TOOL],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [thinking, call]},
            {"role": "user", "content": [result]},
        ],
    }
    url = server.health_url.removesuffix("/health") + "/v1/messages/count_tokens"
    response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == 200, response.text
    return int(response.json()["input_tokens"])


def test_signatures_outlive_a_restart(
    tiny_gguf: Path, tmp_path: Path, encoding: HarmonyEncoding
) -> None:
    key_file = tmp_path / KEY_FILE  # the state directory: the responses store's (tmp_path)
    with server_process(tiny_gguf, tmp_path) as first:
        assert mode(key_file) == 0o600
        signature = ThinkingSigner(key_file.read_bytes()).sign(
            "", encoding.encode(REASONING, allowed_special="all")
        )
        kept, dropped = count(first, signature), count(first, "not-a-signature")
    assert kept > dropped  # the block's tokens replay where the signature verifies
    with server_process(tiny_gguf, tmp_path) as second:  # restarted: the same key
        assert count(second, signature) == kept


def test_a_state_directory_others_may_write_stops_the_start(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    command = serve_command(
        tiny_gguf,
        free_port(),
        *("--cache-dir", str(tmp_path / "cache")),
        *("--responses-store-path", str(state / "responses.sqlite3")),
    )
    ended = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert ended.returncode == 1
    assert f"directory {state} has mode 0777" in ended.stderr + ended.stdout
    assert "Traceback" not in ended.stderr + ended.stdout
    assert not (state / KEY_FILE).exists()
