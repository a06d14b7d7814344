"""Codex CLI (the version devkit/client_pins.py pins) on the trained tiny gpt-oss, unscripted:
it reads a file and edits it.

Nothing is forced: the server runs the trained preset (devkit/trained/model.py) greedy
(temperature 0 by default, as Codex sends none), with its own steering on (harmony's header
grammar, the JSON schema of exec_command's arguments, Codex's Lark grammar for apply_patch).
Codex executes what the model asked for, and the test checks the file on disk.

Codex writes its working directory and CODEX_HOME into the prompt, and the server its date, so
the test fixes all three (devkit/trained/tasks.py). What it cannot fix: the day's date,
which Codex writes from its own clock, and its exec output's chunk id and wall time, new in
every run. `python -m devkit.train_tiny.behaviour --test-days N` sends this request as Codex
sends it from this place on each of the N days from today, those drawn: the committed model
edits the file exactly on 60 of 60 days (`--test-days 60`, devkit/notes/trained-model-runs.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from devkit.trained.tasks import CODEX_EDIT, CODEX_PLACE
from server.ops.codex_config import CodexSetup, write
from tests.support.codex import (
    N_CTX,
    SANDBOX,
    Codex,
    item_types,
)
from tests.support.trained import MODEL, TrainedServer, locked_place, trained_server

pytestmark = pytest.mark.slow  # the real Codex CLI and ≈8k-token prompts


@pytest.fixture(scope="module")
def server(
    encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrainedServer]:
    with trained_server(encoding, tmp_path_factory.mktemp("store"), N_CTX) as running:
        yield running


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """CODEX_PLACE, emptied and held under a lock while the module's tests run."""
    with locked_place(CODEX_PLACE, "codex-edit.lock") as place:
        yield place


@pytest.fixture(scope="module")
def codex(
    codex_binary: Path, server: TrainedServer, encoding: HarmonyEncoding, place: Path
) -> Codex:
    home = place / "home"
    home.mkdir()
    setup = CodexSetup(  # over HTTP, whose SSE streams are recorded
        base_url=server.url,
        model=MODEL,
        context_window=N_CTX,
        stream_idle_timeout_ms=60_000,
        websockets=False,
    )
    write(setup, home)
    return Codex(codex_binary, home, server.prompts, encoding, server.recorder)


def git_repo(path: Path, files: dict[str, str]) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def test_codex_reads_a_file_and_edits_it_with_apply_patch(codex: Codex, place: Path) -> None:
    work = git_repo(place / "repo", {CODEX_EDIT.path: CODEX_EDIT.before})
    run = codex.run(work, "--sandbox", SANDBOX, CODEX_EDIT.ask)
    assert run.returncode == 0, run.stderr
    assert (work / CODEX_EDIT.path).read_text() == CODEX_EDIT.after
    (command,) = run.items("command_execution")
    assert CODEX_EDIT.path in command["command"]
    (change,) = run.items("file_change")
    assert change["changes"] == [{"path": str(work / CODEX_EDIT.path), "kind": "update"}]
    kinds = item_types(run)
    assert "function_call" in kinds[0]
    assert "custom_tool_call" in kinds[1]
    assert kinds[-1][-1] == "message"
    assert run.items("agent_message")
