"""The real Codex CLI (pinned) over the Responses WebSocket, as `codex-config` sets it up
(`supports_websockets = true`), against the server on 127.0.0.1 on the real tiny engine with
forced scripts. What Codex sent and received is recorded on the server's side: the turn must run
over the socket, with no HTTP fallback, each tool round sending only its new items."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.codex_cli import codex_exec
from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.codex_config import CodexSetup, write
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.codex import MODEL, N_CTX, SANDBOX
from tests.support.event_grammar import check_stream
from tests.support.responses import served
from tests.support.responses_socket import Connection, TransportRecorder, responses_of
from tests.support.scripts import reason_then_call

pytestmark = pytest.mark.slow  # the real Codex CLI (installed from npm once per machine)

EXEC_CALL = reason_then_call(
    "SOCKET-ONE: run the command.", "exec_command", '{"cmd":"echo hello-over-socket"}'
)
EXEC_ANSWER = (
    "<|channel|>analysis<|message|>SOCKET-TWO: it printed.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It printed hello-over-socket.<|return|>"
)


@dataclass
class SocketTurn:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    recorder: TransportRecorder
    prompts: list[list[int]]  # the engine's prompt of each generation, in order
    first_output: list[int]
    unused_scripts: int


@pytest.fixture(scope="module")
def turn(
    codex_binary: Path,
    tiny_gguf: Path,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SocketTurn]:
    """One `codex exec` turn (exec_command, its output back, the answer) over the socket."""
    script = ForcedScript(encoding)
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2), sampling_hook=script
    )
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    settings = Settings(responses_store_path=store, responses_keepalive_s=1.0)
    recorder = TransportRecorder(create_app(settings, runtime))
    home = tmp_path_factory.mktemp("codex-home")
    workdir = tmp_path_factory.mktemp("work")
    try:
        with served(recorder) as url:
            setup = CodexSetup(
                base_url=url, model=MODEL, context_window=N_CTX, stream_idle_timeout_ms=60_000
            )
            assert setup.websockets  # what `codex-config` writes by default
            write(setup, home)
            first_output = script.push(EXEC_CALL)
            script.push(EXEC_ANSWER)
            done = codex_exec(
                codex_binary, home, workdir, "--sandbox", SANDBOX, "Run echo hello-over-socket."
            )
            yield SocketTurn(
                done.returncode,
                done.events,
                done.stderr,
                recorder,
                list(script.prompts),
                first_output,
                script.pending,
            )
    finally:
        engine.close()


def generating_creates(socket: Connection) -> list[dict[str, Any]]:
    return [
        m
        for m in socket.received
        if m["type"] == "response.create" and m.get("generate") is not False
    ]


def test_the_turn_runs_over_the_socket_without_http_fallback(turn: SocketTurn) -> None:
    assert turn.returncode == 0, turn.stderr
    assert turn.unused_scripts == 0  # exactly the two scripted generations
    agent = [e["item"] for e in turn.events if e["type"] == "item.completed"]
    (command,) = [item for item in agent if item["type"] == "command_execution"]
    assert "hello-over-socket" in command["aggregated_output"]
    assert [i["text"] for i in agent if i["type"] == "agent_message"] == [
        "It printed hello-over-socket."
    ]
    assert turn.recorder.posts("/v1/responses") == []  # no request went over HTTP
    sockets = [s for s in turn.recorder.sockets() if s.path == "/v1/responses"]
    assert sockets
    creates = [create for socket in sockets for create in generating_creates(socket)]
    assert len(creates) == 2
    for socket in sockets:
        for events in responses_of(socket):
            check_stream(events)  # each response as a streamed POST sends it


def test_the_tool_round_sends_only_its_new_items(
    turn: SocketTurn, encoding: HarmonyEncoding
) -> None:
    (socket,) = [s for s in turn.recorder.sockets() if generating_creates(s)]
    creates = [m for m in socket.received if m["type"] == "response.create"]
    completed = [events[-1] for events in responses_of(socket)]
    assert [event["type"] for event in completed] == ["response.completed"] * len(creates)
    # every create continues the socket's previous response (Codex 0.171 warms the socket up
    # first, `generate: false`), with store: false, which only the socket remembers
    for earlier, create in zip(completed, creates[1:], strict=False):
        assert create["previous_response_id"] == earlier["response"]["id"]
    assert all(create.get("store") is False for create in creates)
    second = generating_creates(socket)[-1]
    assert [item["type"] for item in second["input"]] == ["function_call_output"]
    # and the engine got the first round's prompt and sampled tokens back exactly
    first_prompt, second_prompt = turn.prompts[-2:]
    output = turn.first_output
    assert second_prompt[: len(first_prompt) + len(output)] == first_prompt + output
    tail = encoding.decode_utf8(second_prompt[len(first_prompt) + len(output) :])
    assert tail.startswith("<|start|>functions.exec_command to=assistant<|channel|>commentary")
    usage = completed[-1]["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= len(first_prompt) + len(output) - 1
