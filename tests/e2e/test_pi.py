"""pi (npm @mariozechner/pi-coding-agent, pinned) against /v1/chat/completions, set up as its docs
set up a custom OpenAI-compatible provider (docs/models.md: `models.json` with `baseUrl`, `api:
openai-completions`, `apiKey`, a model with `reasoning: true`).

pi runs headless (`pi --print --mode json --no-session`, stdin closed, its config directory in a
temporary directory) with the server's tiny engine; forced scripts choose what the model says.
Every request pi makes must be answered 200, its streams accepted, the reasoning kept out of the
answer text, and a bash tool round must run the command and send its output back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.client_pins import PI
from devkit.forced import ForcedScript
from tests.support.anthropic import Exchange
from tests.support.npm_cli import (
    RecordedServer,
    pinned_client,
    recorded_server,
    run_json_lines,
    streamed_chats,
)
from tests.support.scripts import reason_then_answer, reason_then_call

pytestmark = pytest.mark.slow  # the real pi CLI (installed from npm once per machine)

N_CTX = 32768  # pi compacts once a prompt passes contextWindow - 16384 (its reserve)
MODEL = "gpt-oss-20b"
TOKEN = "local-token"
PROVIDER = "gpt-oss-server"

ANSWER = reason_then_answer("PI-THOUGHT: a short answer will do.", "Done by pi.")
BASH_CALL = reason_then_call("PI-THOUGHT-ONE: run it.", "bash", '{"command":"echo hello-from-pi"}')
BASH_ANSWER = reason_then_answer("PI-THOUGHT-TWO: it printed.", "It printed hello-from-pi.")


@pytest.fixture(scope="module")
def pi_binary() -> Path:
    return pinned_client(PI)


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@pytest.fixture(scope="module")
def server(
    tiny_gguf: Path, script: ForcedScript, encoding: HarmonyEncoding
) -> Iterator[RecordedServer]:
    with recorded_server(tiny_gguf, script, encoding, n_ctx=N_CTX, name=MODEL, key=TOKEN) as up:
        yield up


def pi_models(url: str) -> dict[str, Any]:
    """`models.json` as pi's docs write it for a local OpenAI-compatible server."""
    return {
        "providers": {
            PROVIDER: {
                "baseUrl": url,
                "api": "openai-completions",
                "apiKey": TOKEN,
                "models": [{"id": MODEL, "reasoning": True, "contextWindow": N_CTX}],
            }
        }
    }


@dataclass
class PiRun:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    exchanges: list[Exchange]

    def assistant_messages(self) -> list[dict[str, Any]]:
        return [
            e["message"]
            for e in self.events
            if e.get("type") == "message_end" and e["message"].get("role") == "assistant"
        ]

    def blocks(self, kind: str) -> list[dict[str, Any]]:
        return [b for m in self.assistant_messages() for b in m["content"] if b["type"] == kind]


def run_pi(binary: Path, server: RecordedServer, workdir: Path, prompt: str) -> PiRun:
    agent_dir = workdir.parent / f"{workdir.name}-pi"
    agent_dir.mkdir()
    (agent_dir / "models.json").write_text(json.dumps(pi_models(server.url)))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(agent_dir),
        "PI_CODING_AGENT_DIR": str(agent_dir),
        "NO_COLOR": "1",
    }
    before = len(server.recorder.exchanges)
    command = [
        str(binary),
        "--provider",
        PROVIDER,
        "--model",
        MODEL,
        "--print",  # answer and exit (`--mode json` alone stays in the session)
        "--mode",
        "json",
        "--no-session",
        prompt,
    ]
    returncode, events, stderr = run_json_lines(command, workdir, env)
    return PiRun(returncode, events, stderr, server.recorder.exchanges[before:])


def test_a_prompt_is_answered_with_the_reasoning_apart(
    pi_binary: Path, server: RecordedServer, script: ForcedScript, tmp_path: Path
) -> None:
    script.push(ANSWER)
    run = run_pi(pi_binary, server, tmp_path, "Say done.")
    assert run.returncode == 0, run.stderr[-4000:]
    (_chat,) = streamed_chats(run.exchanges, TOKEN)  # one request, sent with the key
    assert script.pending == 0
    texts = [b["text"] for b in run.blocks("text")]
    assert texts == ["Done by pi."], run.assistant_messages()
    thinking = " ".join(b["thinking"] for b in run.blocks("thinking"))
    assert "PI-THOUGHT" in thinking  # shown as pi's thinking, never as the answer


def test_a_bash_tool_round(
    pi_binary: Path, server: RecordedServer, script: ForcedScript, tmp_path: Path
) -> None:
    script.push(BASH_CALL)
    script.push(BASH_ANSWER)
    run = run_pi(pi_binary, server, tmp_path, "Run echo hello-from-pi.")
    assert run.returncode == 0, run.stderr[-4000:]
    _, second = streamed_chats(run.exchanges, TOKEN)
    assert script.pending == 0
    (call,) = run.blocks("toolCall")
    assert call["name"] == "bash"
    assert call["arguments"] == {"command": "echo hello-from-pi"}
    messages = second.json()["messages"]
    (result,) = [m for m in messages if m["role"] == "tool"]
    assert result["tool_call_id"] == call["id"]
    assert "hello-from-pi" in json.dumps(result["content"])
    texts = [b["text"] for b in run.blocks("text")]
    assert texts[-1] == "It printed hello-from-pi."
    assert not any("PI-THOUGHT" in text for text in texts)
