"""The real Codex CLI (npm @openai/codex, pinned) against the server on 127.0.0.1.

Codex runs headless (`codex exec --json`, stdin closed, CODEX_HOME in a temp dir set up by
`codex-config`). The server runs the real tiny engine; forced scripts choose what the model
says, one script per request Codex makes, so every request of a scenario is scripted.
"""

from __future__ import annotations

import json
import logging
import re
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
from server.ops.codex_config import CodexSetup, served_model, write
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.codex import (
    MODEL,
    N_CTX,
    SANDBOX,
    Codex,
    CodexRun,
    item_types,
)
from tests.support.responses import StreamRecorder, served
from tests.support.scripts import reason_then_call

pytestmark = pytest.mark.slow  # the real Codex CLI (installed from npm once per machine)

USAGE_LINE = re.compile(r"response (\S+) (\w+): (\d+) input tokens \((\d+) cached\), (\d+) output")


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@dataclass
class Server:
    url: str
    recorder: StreamRecorder  # every stream Codex received, for the grammar checker


@pytest.fixture(scope="module")
def server(
    tiny_gguf: Path,
    script: ForcedScript,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """The server with its own engine (a context large enough for Codex) and store."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2)
    engine = LlamaEngine(config, sampling_hook=script)
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    settings = Settings(responses_store_path=store, responses_keepalive_s=1.0)
    recorder = StreamRecorder(create_app(settings, runtime))
    try:
        with served(recorder) as url:
            yield Server(url, recorder)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def codex(
    codex_binary: Path,
    server: Server,
    script: ForcedScript,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Codex:
    """CODEX_HOME with what `gpt-oss-server codex-config --write` writes for this server."""
    home = tmp_path_factory.mktemp("codex-home")
    assert served_model(server.url) == (MODEL, N_CTX)  # what the command asks the server
    setup = CodexSetup(  # over HTTP, whose SSE streams are recorded (the socket: its own test)
        base_url=server.url,
        model=MODEL,
        context_window=N_CTX,
        stream_idle_timeout_ms=60_000,
        websockets=False,
    )
    write(setup, home)
    return Codex(codex_binary, home, script, encoding, server.recorder)


class UsageLog(logging.Handler):
    """(input, cached, output) tokens of every response, from the server's log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.usages: list[tuple[int, int, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = USAGE_LINE.match(record.getMessage())
        if match:
            self.usages.append((int(match[3]), int(match[4]), int(match[5])))


EXEC_CALL = reason_then_call(
    "THOUGHT-ONE: run the command.", "exec_command", '{"cmd":"echo hello-from-tool"}'
)
EXEC_ANSWER = (
    "<|channel|>analysis<|message|>THOUGHT-TWO: it printed.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The command printed hello-from-tool.<|return|>"
)


@dataclass
class ExecTurn:
    """A finished `codex exec` turn: exec_command, its output sent back, then the answer."""

    run: CodexRun
    workdir: Path
    first_prompt: list[int]
    first_output: list[int]
    second_prompt: list[int]
    usages: list[tuple[int, int, int]]


@pytest.fixture(scope="module")
def exec_turn(codex: Codex, tmp_path_factory: pytest.TempPathFactory) -> ExecTurn:
    workdir = tmp_path_factory.mktemp("work")
    first_output = codex.script.push(EXEC_CALL)
    codex.script.push(EXEC_ANSWER)
    before = len(codex.script.prompts)
    logger = logging.getLogger("server.api.responses.router")
    usage_log, level = UsageLog(), logger.level
    logger.addHandler(usage_log)
    logger.setLevel(logging.INFO)
    try:
        run = codex.run(workdir, "--sandbox", SANDBOX, "Run echo hello-from-tool.")
    finally:
        logger.removeHandler(usage_log)
        logger.setLevel(level)
    assert run.returncode == 0, run.stderr
    assert codex.script.pending == 0  # exactly the two scripted requests
    first, second = codex.script.prompts[before:]
    return ExecTurn(run, workdir, first, first_output, second, usage_log.usages)


def test_exec_command_runs_and_its_output_comes_back(exec_turn: ExecTurn) -> None:
    run = exec_turn.run
    assert item_types(run) == [["reasoning", "function_call"], ["reasoning", "message"]]
    (command,) = run.items("command_execution")
    assert "echo hello-from-tool" in command["command"]
    assert "hello-from-tool" in command["aggregated_output"]
    assert command["exit_code"] == 0
    assert [m["text"] for m in run.items("agent_message")] == [
        "The command printed hello-from-tool."
    ]


def test_second_request_reuses_the_first_ones_kv_cache(codex: Codex, exec_turn: ExecTurn) -> None:
    first, output, second = exec_turn.first_prompt, exec_turn.first_output, exec_turn.second_prompt
    # round 2 = round 1's prompt + exactly the tokens the model sampled + the tool output
    assert second[: len(first) + len(output)] == first + output
    tail = codex.encoding.decode_utf8(second[len(first) + len(output) :])
    assert tail.startswith("<|start|>functions.exec_command to=assistant<|channel|>commentary")
    assert "hello-from-tool" in tail
    assert len(exec_turn.usages) == 2
    (_, _, output_tokens), (input_tokens, cached_tokens, _) = exec_turn.usages
    assert output_tokens == len(output)
    assert input_tokens == len(second)
    assert cached_tokens >= len(first) + len(output) - 1
    assert exec_turn.run.usage["cached_input_tokens"] >= cached_tokens


def test_resumed_turn_drops_the_finished_turns_reasoning(codex: Codex, exec_turn: ExecTurn) -> None:
    codex.script.push(
        "<|channel|>analysis<|message|>THOUGHT-THREE: say it again.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done again.<|return|>"
    )
    run = codex.run(exec_turn.workdir, "resume", "--last", "Say it again.")
    assert run.returncode == 0, run.stderr
    assert item_types(run) == [["reasoning", "message"]]
    assert [m["text"] for m in run.items("agent_message")] == ["Done again."]
    prompt = codex.prompt(-1)
    assert "THOUGHT-ONE" not in prompt  # replayed by Codex, dropped by the server
    assert "THOUGHT-TWO" not in prompt
    call = (
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd":"echo hello-from-tool"}<|call|>'
    )
    assert call in prompt
    assert "<|channel|>final<|message|>The command printed hello-from-tool.<|end|>" in prompt
    assert prompt.endswith("Say it again.<|end|><|start|>assistant")


def test_apply_patch_is_a_custom_tool_call(codex: Codex, tmp_path: Path) -> None:
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello from apply_patch\n*** End Patch\n"
    arguments = json.dumps({"input": patch})
    call = codex.script.push(
        "<|channel|>analysis<|message|>Create the file.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.apply_patch <|constrain|>json"
        f"<|message|>{arguments}<|call|>"
    )
    codex.script.push("<|channel|>final<|message|>Created hello.txt.<|return|>")
    before = len(codex.script.prompts)
    run = codex.run(tmp_path, "--sandbox", SANDBOX, "Create hello.txt.")
    assert run.returncode == 0, run.stderr
    assert codex.script.pending == 0
    assert item_types(run) == [["reasoning", "custom_tool_call"], ["message"]]
    assert run.streams[0].items[1]["input"] == patch
    assert (tmp_path / "hello.txt").read_text() == "hello from apply_patch\n"
    (change,) = run.items("file_change")
    assert change["changes"] == [{"path": str(tmp_path / "hello.txt"), "kind": "add"}]
    assert "type apply_patch = (_: {" in codex.prompt(before)  # offered thanks to the catalog
    first, second = codex.script.prompts[before:]
    assert second[: len(first) + len(call)] == first + call  # the call replayed exactly
    output = codex.encoding.decode_utf8(second[len(first) + len(call) :])
    assert output.startswith("<|start|>functions.apply_patch to=assistant<|channel|>commentary")


def _request_input(codex: Codex, index: int) -> list[dict[str, Any]]:
    path, headers, body = codex.recorder.requests[index]
    assert path.endswith("/responses")
    assert b"content-encoding" not in headers  # Codex sends plain JSON to a custom provider
    items: list[dict[str, Any]] = json.loads(body)["input"]
    return items


def test_sampled_arguments_always_parse(codex: Codex, tmp_path: Path) -> None:
    """Only the call's header is scripted: the tiny model samples update_goal's arguments itself,
    under the grammar of the tool's schema (an enum: random weights complete it in a few tokens),
    and Codex parses them, runs the tool and sends its output back with the call's id."""
    codex.script.push(
        "<|channel|>analysis<|message|>Pause the goal.<|end|><|start|>assistant<|channel|>"
        "commentary to=functions.update_goal <|constrain|>json<|message|>"
    )
    codex.script.push("<|channel|>final<|message|>Paused.<|return|>")
    before = len(codex.recorder.requests)
    run = codex.run(tmp_path, "--sandbox", SANDBOX, "Pause the goal.")
    assert run.returncode == 0, run.stderr
    assert codex.script.pending == 0  # both scripted requests were made
    assert "failed to parse" not in run.stderr
    assert item_types(run) == [["reasoning", "function_call"], ["message"]]
    (call,) = [item for item in run.streams[0].items if item["type"] == "function_call"]
    assert call["name"] == "update_goal"
    logging.getLogger(__name__).info("sampled arguments: %r", call["arguments"])
    assert json.loads(call["arguments"])["status"] in {"complete", "blocked", "paused"}
    second = _request_input(codex, before + 1)
    outputs = [item for item in second if item.get("type") == "function_call_output"]
    assert [item["call_id"] for item in outputs] == [call["call_id"]]
    assert "failed to parse" not in json.dumps(outputs)
    assert [m["text"] for m in run.items("agent_message")] == ["Paused."]
