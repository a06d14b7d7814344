"""Codex CLI (the version devkit/client_pins.py pins) shows the server's reasoning summaries as
its reasoning items, never raw CoT.

Two servers on one tiny engine: the default policy (`raw`), where Codex asks for summaries with
`-c model_reasoning_summary=auto`, and the `summary` policy, where Codex asks for nothing and
still only ever receives summaries. Forced scripts go to generations in the order the engine
admits them: each request's answer, then the summary of its analysis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.codex_config import CodexSetup, write
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.codex import (
    MODEL,
    N_CTX,
    SANDBOX,
    Codex,
    CodexRun,
)
from tests.support.responses import StreamRecorder, served
from tests.support.scripts import reason_then_call

pytestmark = pytest.mark.slow  # the real Codex CLI


THOUGHT_CALL = "RAW-THOUGHT-ONE: I should run the command."
THOUGHT_ANSWER = "RAW-THOUGHT-TWO: it printed, tell the user."
EXEC_CALL = reason_then_call(THOUGHT_CALL, "exec_command", '{"cmd":"echo hello-from-tool"}')
EXEC_ANSWER = (
    f"<|channel|>analysis<|message|>{THOUGHT_ANSWER}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The command printed hello-from-tool.<|return|>"
)
SUMMARY_CALL = "**Running the command** Runs echo to see its output."
SUMMARY_ANSWER = "**Reporting** Tells the user what the command printed."


def summary(text: str) -> str:
    return (
        "<|channel|>analysis<|message|>Summarize it.<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{text}<|return|>"
    )


@dataclass
class Setup:
    codex: Codex
    url: str


@pytest.fixture(scope="module")
def homes(
    tiny_gguf: Path,
    codex_binary: Path,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Setup]]:
    """One engine, two servers (policy raw and summary), a Codex home for each."""
    script = ForcedScript(encoding)
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2), sampling_hook=script
    )
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    recorders = {policy: _app(runtime, policy, tmp_path_factory) for policy in ("raw", "summary")}
    setups: dict[str, Setup] = {}
    try:
        with served(recorders["raw"]) as raw_url, served(recorders["summary"]) as summary_url:
            for policy, url in (("raw", raw_url), ("summary", summary_url)):
                home = tmp_path_factory.mktemp(f"codex-home-{policy}")
                setup = CodexSetup(  # over HTTP, whose SSE streams are recorded
                    base_url=url, model=MODEL, context_window=N_CTX, websockets=False
                )
                write(setup, home)
                codex = Codex(codex_binary, home, script, encoding, recorders[policy])
                setups[policy] = Setup(codex, url)
            yield setups
    finally:
        engine.close()


def _app(runtime: Runtime, policy: str, tmp_path_factory: pytest.TempPathFactory) -> StreamRecorder:
    store = tmp_path_factory.mktemp(f"store-{policy}") / "responses.sqlite3"
    settings = Settings(
        responses_store_path=store, responses_keepalive_s=1.0, reasoning_visibility=policy
    )
    return StreamRecorder(create_app(settings, runtime))


def run_exec_turn(codex: Codex, workdir: Path, *args: str) -> tuple[CodexRun, list[str]]:
    script = codex.script
    for text in (EXEC_CALL, summary(SUMMARY_CALL), EXEC_ANSWER, summary(SUMMARY_ANSWER)):
        script.push(text)
    before = len(script.prompts)
    run = codex.run(workdir, "--sandbox", SANDBOX, *args, "Run echo hello-from-tool.")
    assert run.returncode == 0, run.stderr
    assert script.pending == 0  # two requests, each with one summary
    prompts = [codex.encoding.decode_utf8(p) for p in script.prompts[before:]]
    return run, prompts


def reasoning_items(run: CodexRun) -> list[dict[str, Any]]:
    """The reasoning item of each response the server sent (each passed the grammar checker)."""
    found = []
    for checked in run.streams:
        (reasoning,) = [item for item in checked.items if item["type"] == "reasoning"]
        found.append(reasoning)
    return found


def assert_shows_summaries_only(run: CodexRun) -> None:
    assert [item["text"] for item in run.items("reasoning")] == [SUMMARY_CALL, SUMMARY_ANSWER]
    assert [m["text"] for m in run.items("agent_message")] == [
        "The command printed hello-from-tool."
    ]
    assert "RAW-THOUGHT" not in json.dumps(run.events)
    sent = [[part["text"] for part in item["summary"]] for item in reasoning_items(run)]
    assert sent == [[SUMMARY_CALL], [SUMMARY_ANSWER]]


def test_codex_asks_for_summaries_and_shows_them(homes: dict[str, Setup], tmp_path: Path) -> None:
    codex = homes["raw"].codex
    run, prompts = run_exec_turn(codex, tmp_path, "-c", "model_reasoning_summary=auto")
    assert_shows_summaries_only(run)
    assert "RAW-THOUGHT" not in run.stderr
    # Codex did get the raw chain of thought (policy raw): showing the summary is its own choice
    raw = [[part["text"] for part in item["content"]] for item in reasoning_items(run)]
    assert raw == [[THOUGHT_CALL], [THOUGHT_ANSWER]]
    first_summary_prompt = prompts[1]
    assert f"<|start|>user<|message|>{THOUGHT_CALL}<|end|>" in first_summary_prompt
    assert "You are a coding agent" not in first_summary_prompt  # no developer instructions


def test_summary_policy_never_sends_raw_reasoning_to_codex(
    homes: dict[str, Setup], tmp_path: Path
) -> None:
    codex = homes["summary"].codex
    before = len(codex.recorder.streams)
    run, prompts = run_exec_turn(codex, tmp_path)  # Codex asks for no summary
    assert_shows_summaries_only(run)
    for raw in codex.recorder.streams[before:]:
        assert b"RAW-THOUGHT" not in raw
        assert b"reasoning_text" not in raw
    second_prompt = prompts[2]  # Codex replayed a summary-only item: the server restored CoT
    call = "<|start|>assistant<|channel|>commentary to=functions.exec_command"
    assert f"<|channel|>analysis<|message|>{THOUGHT_CALL}<|end|>{call}" in second_prompt
    assert SUMMARY_CALL not in second_prompt
