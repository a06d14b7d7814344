"""Claude Code (the version devkit/client_pins.py pins) on the trained tiny gpt-oss, unscripted:
tool rounds through /v1/messages.

Nothing is forced: the server runs the trained preset greedy with its steering on (harmony's
header grammar over Claude Code's tools, the Bash tool's JSON schema). The committed model was
trained with Claude Code-shaped rounds (the corpus's --claude: Claude Code's captured prompt with
other asks). The test draws its rounds as the corpus draws them, from the held-out words (never
in the corpus) and a seed it prints: a command (an `echo` of a phrase, or `cat`, `ls`, `wc -l`,
`grep -n`, `head -n` on a file the round's working directory holds) asked in one of the corpus's
wordings. Claude Code runs what the model called and sends the result back for a final answer.

Every round must go through (the CLI succeeds, every request is answered, the model calls
Bash, then answers); the asked command must be called exactly in at least FLOOR of the ROUNDS.
The floor is below what the committed model does over many seeds (docs/trained-model.md), so a
drawn case does not fail the test and a regression does.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.train_tiny.corpus import ClaudeAsk, Values, claude_ask
from devkit.trained.words import word_pool
from tests.support.anthropic import ExchangeRecorder
from tests.support.claude_code import (
    N_CTX,
    ClaudeRun,
    Server,
    run_claude,
)
from tests.support.trained import trained_server

pytestmark = pytest.mark.slow  # the real Claude Code CLI and its ≈20k-token prompt

ROUNDS = 6
# of ROUNDS, the asked command called exactly: the committed model (b7) over the seeds 0 to 7,
# 1 to 5 (3 3 3 5 5 4 1 3; 27 of 48 rounds), 3 with seed 0; the floor is the least of them
FLOOR = 1
SEED = int(os.environ.get("GPT_OSS_TRAINED_CLAUDE_SEED", "0"))


@pytest.fixture(scope="module")
def server(encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("store")
    with trained_server(encoding, store, N_CTX, ExchangeRecorder) as running:
        yield Server(running.url.removesuffix("/v1"), running.recorder)


def drawn_rounds(encoding: HarmonyEncoding, seed: int) -> list[ClaudeAsk]:
    values = Values(random.Random(seed), word_pool(encoding)[1])
    return [claude_ask(values) for _ in range(ROUNDS)]


def working_directory(ask: ClaudeAsk, root: Path) -> Path:
    """A directory holding the file the command reads (a line with grep's pattern first)."""
    root.mkdir()
    words = ask.command.split()
    if words[0] != "echo":
        file = root / ask.path
        file.parent.mkdir(parents=True, exist_ok=True)
        first = f"{words[2]} {ask.phrase}" if words[0] == "grep" else ask.phrase
        file.write_text(f"{first}\n{ask.phrase}\n")
    return root


def tool_uses(run: ClaudeRun) -> list[dict[str, Any]]:
    return [
        block
        for event in run.events
        if event.get("type") == "assistant"
        for block in event["message"]["content"]
        if block.get("type") == "tool_use"
    ]


def tool_results(run: ClaudeRun) -> list[dict[str, Any]]:
    return [
        block
        for event in run.events
        if event.get("type") == "user"
        for block in event["message"]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def test_claude_code_runs_the_asked_commands(
    claude_binary: Path, server: Server, encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    print(f"seed {SEED} (GPT_OSS_TRAINED_CLAUDE_SEED)")
    exact = 0
    for i, ask in enumerate(drawn_rounds(encoding, SEED)):
        work = working_directory(ask, tmp_path / f"work{i}")
        run = run_claude(claude_binary, server, work, tmp_path / f"home{i}", ask.text)
        assert run.returncode == 0, run.stderr[-4000:]
        answered = [(e.path, e.status) for e in run.messages_requests()]
        assert all(status == 200 for _, status in answered), answered
        calls = tool_uses(run)
        assert calls, ask
        assert all(c["name"] == "Bash" for c in calls), calls
        results = tool_results(run)
        assert len(results) == len(calls), results  # Claude Code ran every call
        assert run.result["subtype"] == "success"
        assert len(run.messages_requests()) >= 2  # the call, then the answer after its result
        commands = [c["input"].get("command") for c in calls]
        print(f"{ask.text!r}: called {commands}")
        if commands == [ask.command]:
            assert not results[0].get("is_error"), results
            if ask.command.startswith("echo "):
                assert ask.command.removeprefix("echo ") in str(results[0]["content"])
            exact += 1
    print(f"the asked command called exactly in {exact} of {ROUNDS} rounds")
    assert exact >= FLOOR
