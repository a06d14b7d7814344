"""Claude Code (the version devkit/client_pins.py pins) on the trained tiny gpt-oss, unscripted:
tool rounds through /v1/messages.

Nothing is forced: the server runs the trained preset greedy with its steering on (harmony's
header grammar over Claude Code's tools, the Bash tool's JSON schema). The committed model was
trained with Claude Code-shaped rounds (the corpus's --claude: Claude Code's captured prompt with
other asks). The test draws its rounds as the corpus draws them, from the held-out words (never
in the corpus) and a fixed seed: a command (an `echo` of a phrase, or `cat`, `ls`, `wc -l`,
`grep -n`, `head -n` on a file the round's working directory holds) asked in one of the corpus's
wordings. Claude Code runs what the model called and sends the result back for a final answer.

Claude Code writes its working directory, its home and the day's date into its prompt: the
rounds run in fixed directories (CLAUDE_PLACE, held under a lock) and the server reads every
request with Claude Code's date replaced by CONVERSATION_DATE (DatePin), so each round's prompt
is the same tokens on every run and the count is the same on every run.

Every round must go through (the CLI succeeds, every request is answered, the model calls
Bash, then answers); the asked command must be called exactly in at least the floor of the
ROUNDS: devkit/floors.py's rule (the committed model's count on this draw less two, above what a
model copying one round in ten gets).
"""

from __future__ import annotations

import datetime
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from devkit import floors
from devkit.train_tiny.corpus import ClaudeAsk, Values, claude_ask
from devkit.trained.tasks import CLAUDE_PLACE, CONVERSATION_DATE
from devkit.trained.words import word_pool
from tests.support.anthropic import ExchangeRecorder
from tests.support.claude_code import (
    N_CTX,
    ClaudeRun,
    Server,
    run_claude,
)
from tests.support.trained import locked_place, trained_server

pytestmark = pytest.mark.slow  # the real Claude Code CLI and its ≈20k-token prompt

ROUNDS = 6
SEED = 0  # the draw's seed


@dataclass
class DatePin:
    """ASGI middleware: every request body with the dates Claude Code may have written for
    today (local or UTC, today or yesterday: a run may cross midnight) as CONVERSATION_DATE."""

    app: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        for day in claude_days():
            body = body.replace(day.isoformat().encode(), CONVERSATION_DATE.isoformat().encode())
        delivered = False

        async def pinned_receive() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, pinned_receive, send)


def claude_days() -> set[datetime.date]:
    now = datetime.datetime.now(datetime.UTC)
    days = {now.date(), now.astimezone().date()}
    return days | {d - datetime.timedelta(days=1) for d in days}


@pytest.fixture(scope="module")
def server(encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("store")
    with trained_server(
        encoding, store, N_CTX, lambda app: ExchangeRecorder(DatePin(app))
    ) as running:
        yield Server(running.url.removesuffix("/v1"), running.recorder)


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """CLAUDE_PLACE, held under a lock while the module's tests run."""
    with locked_place(CLAUDE_PLACE, "claude-rounds.lock") as place:
        yield place


def drawn_rounds(encoding: HarmonyEncoding, seed: int) -> list[ClaudeAsk]:
    values = Values(random.Random(seed), word_pool(encoding)[1])
    return [claude_ask(values) for _ in range(ROUNDS)]


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def working_directory(ask: ClaudeAsk, root: Path) -> Path:
    """`root`, emptied, holding the file the command reads (a line with grep's pattern first)."""
    fresh(root)
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
    claude_binary: Path, server: Server, encoding: HarmonyEncoding, place: Path
) -> None:
    exact: list[bool] = []
    for ask in drawn_rounds(encoding, SEED):
        work = working_directory(ask, place / "work")
        run = run_claude(claude_binary, server, work, fresh(place / "home"), ask.text)
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
        exact.append(commands == [ask.command])
        if exact[-1]:
            assert not results[0].get("is_error"), results
            if ask.command.startswith("echo "):
                assert ask.command.removeprefix("echo ") in str(results[0]["content"])
    copied = floors.tally("claude_code", exact)
    print(copied)
    assert copied.holds, str(copied)
