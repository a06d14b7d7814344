"""The real Claude Code CLI, pinned (devkit/client_pins.py), as the Claude Code tests drive it:
the binary (a module fixture), the server it talks to, and one headless `claude -p` run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devkit.client_pins import CLAUDE_CODE
from tests.support.anthropic import (
    CheckedMessageStream,
    Exchange,
    ExchangeRecorder,
    check_messages_sse,
)
from tests.support.npm_cli import pinned_client, run_json_lines

N_CTX = 32768  # Claude Code's first prompt (system prompt and 12 tools) is long
SMALL_N_CTX = 8192  # smaller than that prompt (≈10k tokens)
MODEL = "gpt-oss-20b"
TOKEN = "local-token"
# Header values worth recording; others are recorded by name only.


@pytest.fixture(scope="module")
def claude_binary() -> Path:
    """Claude Code from npm, installed once per machine into a cache directory."""
    return pinned_client(CLAUDE_CODE)


@dataclass
class Server:
    root: str  # the base URL Anthropic clients want: no /v1
    recorder: ExchangeRecorder


@dataclass
class ClaudeRun:
    """What `claude -p` did: exit status, stream-json events, stderr, the server's exchanges."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    exchanges: list[Exchange]

    @property
    def result(self) -> dict[str, Any]:
        results = [e for e in self.events if e.get("type") == "result"]
        assert len(results) == 1, self.events
        return results[0]

    def messages_requests(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == "/v1/messages"]

    def streams(self) -> list[CheckedMessageStream]:
        """What the server streamed, each stream through the checker."""
        return [
            check_messages_sse(e.response.decode().splitlines())
            for e in self.messages_requests()
            if e.content_type.startswith("text/event-stream")
        ]


def run_claude(binary: Path, server: Server, workdir: Path, home: Path, prompt: str) -> ClaudeRun:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": server.root,
        "ANTHROPIC_AUTH_TOKEN": TOKEN,
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "NO_COLOR": "1",
    }
    before = len(server.recorder.exchanges)
    command = [
        str(binary),
        "-p",
        prompt,
        "--output-format",
        "stream-json",
        "--verbose",
        "--allowedTools",
        "Bash",
    ]
    returncode, events, stderr = run_json_lines(command, workdir, env)
    exchanges = server.recorder.exchanges[before:]
    return ClaudeRun(returncode, events, stderr, exchanges)
