"""The real Codex CLI, pinned (devkit/client_pins.py), as the Codex tests drive it: the binary
(a module fixture), Codex set up for a server (CODEX_HOME from codex-config) with the server's
forced script, and what one `codex exec --json` run did."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.client_pins import CODEX
from devkit.codex_cli import codex_exec
from devkit.forced import ForcedScript
from tests.support.event_grammar import CheckedStream
from tests.support.npm_cli import pinned_client
from tests.support.responses import StreamRecorder, check_sse

N_CTX = 16384  # Codex's first prompt alone is ≈7.3k tokens
MODEL = "gpt-oss-tiny"
SANDBOX = "workspace-write"  # one mode for all runs: the permission text is part of the prefix


@pytest.fixture(scope="module")
def codex_binary() -> Path:
    """The Codex CLI from npm, installed once per machine into a cache directory."""
    return pinned_client(CODEX)


@dataclass
class CodexRun:
    """What `codex exec --json` did: its exit status, JSONL events and stderr."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    streams: list[CheckedStream]  # what the server sent, each through the grammar checker

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [
            e["item"]
            for e in self.events
            if e["type"] == "item.completed" and e["item"]["type"] == kind
        ]

    @property
    def usage(self) -> dict[str, int]:
        (turn,) = [e for e in self.events if e["type"] == "turn.completed"]
        return dict(turn["usage"])


@dataclass
class Codex:
    """Codex set up for the server (CODEX_HOME from codex-config) and the server's script."""

    binary: Path
    home: Path
    script: ForcedScript
    encoding: HarmonyEncoding
    recorder: StreamRecorder

    def run(self, workdir: Path, *args: str) -> CodexRun:
        before = len(self.recorder.streams)
        done = codex_exec(self.binary, self.home, workdir, *args)
        streams = [check_sse(raw) for raw in self.recorder.streams[before:]]
        return CodexRun(done.returncode, done.events, done.stderr, streams)

    def prompt(self, index: int) -> str:
        return self.encoding.decode_utf8(self.script.prompts[index])


def item_types(run: CodexRun) -> list[list[str]]:
    """The output item types of every response the server streamed to Codex."""
    for checked in run.streams:
        assert checked.types()[-1] == "response.completed"
    return [[item["type"] for item in checked.items] for checked in run.streams]
