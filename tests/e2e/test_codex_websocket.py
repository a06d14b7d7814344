"""The real Codex CLI (pinned) over the Responses WebSocket, against the server on 127.0.0.1 on
the real tiny engine with forced scripts, set up two ways: as `codex-config` writes it (a provider
of its own, `supports_websockets = true`), and as Codex's built-in `openai` provider pointed at
the server (`openai_base_url`). What Codex sent and received, and when, is recorded on the
server's side: the turn must run over the socket, with no HTTP fallback and no retried
handshake, each tool round sending only its new items; with the socket turned off
(--no-websocket) Codex must fall back to HTTP at once, on the first 426.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.codex_cli import CODEX_VERSION, codex_exec
from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.codex_config import CATALOG_NAME, CodexSetup, catalog, write
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.codex import MODEL, N_CTX, SANDBOX
from tests.support.event_grammar import check_stream
from tests.support.responses import served
from tests.support.responses_socket import Connection, TransportRecorder, responses_of
from tests.support.scripts import answer, reason_then_call

pytestmark = pytest.mark.slow  # the real Codex CLI (installed from npm once per machine)

EXEC_CALL = reason_then_call(
    "SOCKET-ONE: run the command.", "exec_command", '{"cmd":"echo hello-over-socket"}'
)
EXEC_ANSWER = (
    "<|channel|>analysis<|message|>SOCKET-TWO: it printed.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It printed hello-over-socket.<|return|>"
)


@dataclass
class Tiny:
    """The module's engine, and the script that chooses what it samples."""

    runtime: Runtime
    script: ForcedScript


@pytest.fixture(scope="module")
def tiny(tiny_gguf: Path, encoding: HarmonyEncoding) -> Iterator[Tiny]:
    script = ForcedScript(encoding)
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2), sampling_hook=script
    )
    try:
        yield Tiny(Runtime(engine=engine, encoding=encoding, model_name=MODEL), script)
    finally:
        engine.close()


def recorded_app(tiny: Tiny, store: Path, **settings: Any) -> TransportRecorder:
    """The server's app on the module's engine, every connection to it recorded."""
    config = Settings(responses_store_path=store, responses_keepalive_s=1.0, **settings)
    return TransportRecorder(create_app(config, tiny.runtime))


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
    codex_binary: Path, tiny: Tiny, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SocketTurn]:
    """One `codex exec` turn (exec_command, its output back, the answer) over the socket."""
    script = tiny.script
    recorder = recorded_app(tiny, tmp_path_factory.mktemp("store") / "responses.sqlite3")
    home = tmp_path_factory.mktemp("codex-home")
    workdir = tmp_path_factory.mktemp("work")
    with served(recorder) as url:
        setup = CodexSetup(
            base_url=url, model=MODEL, context_window=N_CTX, stream_idle_timeout_ms=60_000
        )
        assert setup.websockets  # what `codex-config` writes by default
        write(setup, home)
        before = len(script.prompts)
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
            script.prompts[before:],
            first_output,
            script.pending,
        )
    script.clear()


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


# Codex's built-in `openai` provider pointed at the server: `openai_base_url` (a top-level key of
# config.toml) moves the provider Codex uses by default, with its own settings: WebSockets on,
# an API key (CODEX_API_KEY for `codex exec`), and its default retries (5 stream reconnects
# after 0.2, 0.4, 0.8, 1.6 and 3.2 s: 5.6 s at least with its jitter). Without retries the first
# handshake is the one that works, and with the socket off, the first 426 sends Codex to HTTP.
OPENAI_ANSWER = answer("Session started.")
RETRY_CYCLE_S = 5.6  # the least time Codex's five reconnects take before it gives up
FALLBACK_GAP_S = 3.0  # the 426 to the POST: well under one retry cycle


@dataclass
class ProviderRun:
    """One `codex exec` turn with the built-in `openai` provider, timed from its launch."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    recorder: TransportRecorder
    launched: float  # time.monotonic() just before Codex started

    def to_responses(self) -> list[Connection]:
        """Every connection Codex made to /v1/responses (sockets and POSTs), in order."""
        return [c for c in self.recorder.connections if c.path == "/v1/responses"]

    def answers(self) -> list[str]:
        items = [e["item"] for e in self.events if e["type"] == "item.completed"]
        return [i["text"] for i in items if i["type"] == "agent_message"]


def openai_provider_home(home: Path, base_url: str) -> None:
    """CODEX_HOME for the built-in `openai` provider at `base_url`: no provider table of our
    own, only `openai_base_url`, and the model catalog codex-config writes (the tiny model's
    context window)."""
    setup = CodexSetup(base_url=base_url, model=MODEL, context_window=N_CTX)
    catalog_path = home / CATALOG_NAME
    catalog_path.write_text(json.dumps(catalog(setup)), encoding="utf-8")
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "openai"\n'
        f"openai_base_url = {json.dumps(base_url)}\n"
        'model_reasoning_effort = "medium"\n'
        f"model_catalog_json = {json.dumps(str(catalog_path))}\n",
        encoding="utf-8",
    )


def provider_run(
    codex_binary: Path, tiny: Tiny, tmp_path_factory: pytest.TempPathFactory, **settings: Any
) -> ProviderRun:
    recorder = recorded_app(
        tiny, tmp_path_factory.mktemp("store") / "responses.sqlite3", **settings
    )
    home = tmp_path_factory.mktemp("codex-home")
    workdir = tmp_path_factory.mktemp("work")
    tiny.script.push(OPENAI_ANSWER)
    try:
        with served(recorder) as url:
            openai_provider_home(home, url)
            launched = time.monotonic()
            done = codex_exec(
                codex_binary,
                home,
                workdir,
                "--sandbox",
                SANDBOX,
                "Say you started.",
                extra_env={"CODEX_API_KEY": "local-key"},  # the provider asks for one
            )
    finally:
        tiny.script.clear()
    return ProviderRun(done.returncode, done.events, done.stderr, recorder, launched)


@pytest.fixture(scope="module")
def openai_socket(
    codex_binary: Path, tiny: Tiny, tmp_path_factory: pytest.TempPathFactory
) -> ProviderRun:
    return provider_run(codex_binary, tiny, tmp_path_factory)


@pytest.fixture(scope="module")
def openai_no_socket(
    codex_binary: Path, tiny: Tiny, tmp_path_factory: pytest.TempPathFactory
) -> ProviderRun:
    return provider_run(codex_binary, tiny, tmp_path_factory, websocket=False)


def test_the_openai_provider_starts_over_the_socket_without_retries(
    openai_socket: ProviderRun, capsys: pytest.CaptureFixture[str]
) -> None:
    run = openai_socket
    assert run.returncode == 0, run.stderr
    assert run.answers() == ["Session started."]
    attempts = run.to_responses()
    # the first connection to /v1/responses was an upgrade, and it succeeded; no handshake was
    # refused or tried again, and nothing went over HTTP
    assert attempts
    assert attempts[0].kind == "websocket"
    assert [c.status for c in attempts] == [101] * len(attempts)
    assert run.recorder.posts("/v1/responses") == []
    (socket,) = [s for s in attempts if generating_creates(s)]
    assert [events[-1]["type"] for events in responses_of(socket)][-1] == "response.completed"
    creates = [
        at
        for c in attempts
        for at, m in zip(c.received_at, c.received, strict=True)
        if m["type"] == "response.create"
    ]
    handshake = attempts[0].at - run.launched
    session_start = min(creates) - run.launched
    with capsys.disabled():
        print(
            f"\nCodex {CODEX_VERSION}, built-in openai provider over the socket: first handshake "
            f"{handshake:.2f} s after launch, session start (first response.create) "
            f"{session_start:.2f} s; {len(attempts)} socket(s), every one accepted"
        )
    # no fallback delay: a refused first socket costs a retry cycle before anything is sent
    assert session_start - handshake < RETRY_CYCLE_S


def test_with_the_socket_off_the_openai_provider_falls_back_to_http_at_once(
    openai_no_socket: ProviderRun, capsys: pytest.CaptureFixture[str]
) -> None:
    run = openai_no_socket
    assert run.returncode == 0, run.stderr
    assert run.answers() == ["Session started."]
    attempts = run.to_responses()
    # one handshake, refused with 426, then HTTP only: Codex tried no second socket
    refused_sockets = [c for c in attempts if c.kind == "websocket"]
    assert [c.status for c in refused_sockets] == [426]
    assert attempts[0] is refused_sockets[0]
    posts = run.recorder.posts("/v1/responses")
    assert posts
    assert all(c.status == 200 for c in posts)
    gap = posts[0].at - refused_sockets[0].at
    with capsys.disabled():
        print(
            f"\nCodex {CODEX_VERSION}, built-in openai provider, --no-websocket: 426 "
            f"{refused_sockets[0].at - run.launched:.2f} s after launch, first POST {gap:.3f} s "
            f"after it (a retry cycle takes {RETRY_CYCLE_S} s at least)"
        )
    assert gap < FALLBACK_GAP_S
