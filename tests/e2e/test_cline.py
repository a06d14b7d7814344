"""Cline's CLI (npm `cline`, pinned) against /v1/chat/completions, set up as its docs set up an
OpenAI-compatible provider (`cline auth --provider openai --apikey K --modelid M --baseurl URL`).

Cline runs headless (`cline --json --yolo PROMPT`, stdin closed, its configuration under a
temporary HOME) with the server's tiny engine; forced scripts choose what the model says. A
Cline run ends only when the model calls its `submit_and_exit` tool (a plain answer gets a
"[SYSTEM] This run is not complete…" nudge), so every script ends with that call. Every request
Cline makes must be answered 200 with a stream it accepts; the reasoning must come back to the
server as reasoning (`reasoning_content`), never as answer text; a `run_commands` round must run
the command and send its output back; the second request must reuse the first's KV cache.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.client_pins import CLINE
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
from tests.support.sse import parse_sse

pytestmark = pytest.mark.slow  # the real Cline CLI (installed from npm once per machine)

N_CTX = 16384  # Cline's first prompt (its system prompt and five tools) is ≈2.6k tokens
MODEL = "gpt-oss-20b"
TOKEN = "cline-token"


ANSWER = reason_then_answer("CLINE-THOUGHT: a short answer will do.", "Done by cline.")
SUBMIT = reason_then_call(
    "CLINE-THOUGHT-SUBMIT: it is answered.",
    "submit_and_exit",
    json.dumps({"summary": "Answered the request.", "verified": True}),
)
RUN = reason_then_call(
    "CLINE-THOUGHT-RUN: run it.",
    "run_commands",
    json.dumps({"commands": ["echo hello-from-cline"]}),
)


@pytest.fixture(scope="module")
def cline_binary() -> Path:
    return pinned_client(CLINE)


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@pytest.fixture(scope="module")
def server(
    tiny_gguf: Path, script: ForcedScript, encoding: HarmonyEncoding
) -> Iterator[RecordedServer]:
    with recorded_server(tiny_gguf, script, encoding, n_ctx=N_CTX, name=MODEL, key=TOKEN) as up:
        yield up


@dataclass
class ClineRun:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    exchanges: list[Exchange]

    def result(self) -> dict[str, Any]:
        (result,) = [e for e in self.events if e.get("type") == "run_result"]
        return result

    def agent_events(self, kind: str) -> list[dict[str, Any]]:
        events = [e["event"] for e in self.events if e.get("type") == "agent_event"]
        return [e for e in events if e.get("type") == kind]


def run_cline(binary: Path, server: RecordedServer, workdir: Path, prompt: str) -> ClineRun:
    home = workdir.parent / f"{workdir.name}-home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "NO_COLOR": "1"}
    auth = [str(binary), "auth", "--provider", "openai", "--apikey", TOKEN, "--modelid", MODEL]
    configured = subprocess.run(
        [*auth, "--baseurl", server.url],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert configured.returncode == 0, configured.stdout + configured.stderr
    before = len(server.recorder.exchanges)
    command = [str(binary), "--json", "--yolo", prompt]
    returncode, events, stderr = run_json_lines(command, workdir, env)
    return ClineRun(returncode, events, stderr, server.recorder.exchanges[before:])


def _usage(chat: Exchange) -> dict[str, Any]:
    events = parse_sse(chat.response.decode().splitlines())
    chunks = [event.json() for event in events if event.data != "[DONE]"]
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    return usage  # type: ignore[no-any-return]


def _assistant_turns(chat: Exchange) -> list[dict[str, Any]]:
    return [m for m in chat.json()["messages"] if m["role"] == "assistant"]


def test_a_prompt_is_answered_and_the_reasoning_sent_back_apart(
    cline_binary: Path, server: RecordedServer, script: ForcedScript, tmp_path: Path
) -> None:
    script.push(ANSWER)
    script.push(SUBMIT)
    run = run_cline(cline_binary, server, tmp_path, "Say done.")
    assert run.returncode == 0, (run.stderr[-3000:], run.events[-5:])
    first, second = streamed_chats(run.exchanges, TOKEN)
    assert script.pending == 0
    assert run.result()["finishReason"] == "completed", run.result()
    reasoning = "".join(e.get("reasoning", "") for e in run.agent_events("content_start"))
    assert "CLINE-THOUGHT" in reasoning  # shown as Cline's reasoning
    (answer,) = _assistant_turns(second)  # the answer, sent back with its reasoning apart
    assert answer["content"] == "Done by cline."
    assert answer["reasoning_content"] == "CLINE-THOUGHT: a short answer will do."
    assert (
        _usage(second)["prompt_tokens_details"]["cached_tokens"]
        > 0.9 * _usage(first)["prompt_tokens"]
    )  # the second request continues the first's KV cache


def test_a_run_commands_round(
    cline_binary: Path, server: RecordedServer, script: ForcedScript, tmp_path: Path
) -> None:
    script.push(RUN)
    script.push(SUBMIT)
    run = run_cline(cline_binary, server, tmp_path, "Run echo hello-from-cline.")
    assert run.returncode == 0, (run.stderr[-3000:], run.events[-5:])
    first, second = streamed_chats(run.exchanges, TOKEN)
    assert script.pending == 0
    assert run.result()["finishReason"] == "completed", run.result()
    (call_turn,) = _assistant_turns(second)
    (call,) = call_turn["tool_calls"]
    assert call["function"]["name"] == "run_commands"
    assert json.loads(call["function"]["arguments"]) == {"commands": ["echo hello-from-cline"]}
    assert "CLINE-THOUGHT-RUN" not in (call_turn.get("content") or "")
    (result,) = [m for m in second.json()["messages"] if m["role"] == "tool"]
    assert result["tool_call_id"] == call["id"]
    assert "hello-from-cline" in json.dumps(result["content"])
    assert first.json()["tools"] == second.json()["tools"]
