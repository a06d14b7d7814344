"""A Responses WebSocket keeps its conversation's engine slot for its life: a real engine with two
slots, other clients' requests over HTTP between the socket's turns, and the engine's own count
of the prompt tokens it reused (`cached_tokens`) as the evidence.

With two slots, two HTTP requests with prompts of their own are enough to evict an unpinned
conversation: the first takes the empty slot, the second the least recently used one, the
socket's. Pinned, the socket's slot is left alone and its next turn evaluates only what is new;
once the socket ends (closed, or dropped without a close), the slot is anyone's again.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding
from websockets.sync.client import ClientConnection, connect

from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.event_grammar import CheckedStream
from tests.support.responses import MODEL, served
from tests.support.responses_socket import TransportRecorder, create, socket_url

N_SLOTS = 2
N_CTX = 4096
# a final answer alone: an analysis before it would be dropped from the next prompt (harmony's
# rule), which then diverges from the slot there, pinned or not
ANSWER = "<|channel|>final<|message|>Noted {}.<|return|>"


@dataclass
class Server:
    url: str
    script: ForcedScript
    recorder: TransportRecorder


@pytest.fixture(scope="module")
def server(
    tiny_gguf: Path, encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The app on an engine of its own with two slots, no prompt cache on disk (an evicted
    conversation must not come back from it)."""
    script = ForcedScript(encoding)
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_slots=N_SLOTS, n_threads=2)
    engine = LlamaEngine(config, sampling_hook=script)
    assert engine.prompt_cache is None
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    settings = Settings(
        responses_store_path=tmp_path_factory.mktemp("pin-store") / "responses.sqlite3",
        responses_keepalive_s=3600,
        prompt_cache=False,
    )
    recorder = TransportRecorder(create_app(settings, runtime))
    try:
        with served(recorder) as url:
            yield Server(url, script, recorder)
    finally:
        engine.close()


def cached(usage: dict[str, Any]) -> int:
    return int(usage["input_tokens_details"]["cached_tokens"])


def socket_turn(ws: ClientConnection, script: ForcedScript, **body: Any) -> CheckedStream:
    script.push(ANSWER.format(uuid.uuid4().hex[:8]))
    turn = create(ws, **body)
    assert turn.terminal["type"] == "response.completed"
    return turn


def post(server: Server, **body: Any) -> dict[str, Any]:
    """A response over HTTP (another client), answered in full."""
    server.script.push(ANSWER.format(uuid.uuid4().hex[:8]))
    answer = httpx.post(f"{server.url}/responses", json={"model": MODEL, **body}, timeout=120)
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    assert data["status"] == "completed"
    return data


def others(server: Server) -> None:
    """As many conversations of other clients as the engine has slots, each with a prompt of
    its own (they share no more than the system message with the socket's)."""
    for _ in range(N_SLOTS):
        tag = uuid.uuid4().hex
        post(server, instructions=f"Another client {tag}.", input=f"Unrelated {tag}", store=False)


@dataclass
class FirstTurn:
    """A socket's first turn, and how many tokens its slot then holds that a continuation
    reuses: the prompt and what was sampled (all but the last token evaluated)."""

    response_id: str
    instructions: str  # sent again with every turn, as Codex does (they are not carried over)
    held: int


def first_turn(ws: ClientConnection, server: Server, *, store: bool) -> FirstTurn:
    tag = uuid.uuid4().hex
    # long enough that what the socket's turn holds dwarfs the system message any prompt shares
    instructions = f"The socket's task {tag}: " + ", ".join(f"step {i}" for i in range(80))
    turn = socket_turn(ws, server.script, instructions=instructions, input=tag, store=store)
    response = turn.terminal["response"]
    usage = response["usage"]
    return FirstTurn(
        response["id"], instructions, usage["input_tokens"] + usage["output_tokens"] - 1
    )


def next_turn(ws: ClientConnection, server: Server, first: FirstTurn) -> int:
    """The socket's next turn, continuing the first: the prompt tokens the engine reused."""
    turn = socket_turn(
        ws,
        server.script,
        previous_response_id=first.response_id,
        instructions=first.instructions,
        input="And now?",
        store=False,
    )
    usage = turn.terminal["response"]["usage"]
    assert usage["input_tokens"] > first.held
    return cached(usage)


def test_the_socket_s_next_turn_finds_its_conversation_after_other_clients(
    server: Server,
) -> None:
    with connect(socket_url(server.url)) as ws:
        first = first_turn(ws, server, store=False)
        others(server)  # unpinned, the second of them takes the socket's slot
        reused = next_turn(ws, server, first)
    # the whole first turn was still in the slot: only the new message was evaluated
    assert reused >= first.held, (reused, first.held)


def wait_ended(recorder: TransportRecorder, seconds: float = 30.0) -> None:
    """Until the server is done with every socket (its handler returned: the pin released)."""
    deadline = time.monotonic() + seconds
    while not all(c.ended for c in recorder.connections if c.kind == "websocket"):
        assert time.monotonic() < deadline, "the server kept a socket open"
        time.sleep(0.02)


def continued_over_http(server: Server, first: FirstTurn) -> int:
    """The stored socket response continued by another request: the prompt tokens the engine
    found cached (a copy of the pinned slot's prefix, or what is left of it)."""
    data = post(
        server,
        previous_response_id=first.response_id,
        instructions=first.instructions,
        input="Continued elsewhere.",
        store=False,
    )
    return cached(data["usage"])


@pytest.mark.parametrize("ending", ["close", "drop"])
def test_the_slot_is_released_when_the_socket_ends(server: Server, ending: str) -> None:
    """While the socket is open its slot survives the other clients (a continuation of its
    stored response finds the whole turn); once it ends, closed or dropped without a close
    frame, the same traffic takes the slot."""
    with connect(socket_url(server.url)) as ws:
        first = first_turn(ws, server, store=True)
        others(server)
        assert continued_over_http(server, first) >= first.held  # pinned: still there
        if ending == "close":
            ws.close()
        else:  # the client vanishes: no close frame, the TCP connection just ends
            ws.socket.shutdown(socket.SHUT_RDWR)
            ws.socket.close()
        wait_ended(server.recorder)
    others(server)
    assert continued_over_http(server, first) < first.held // 2  # the slot was given away


def test_when_every_slot_is_pinned_the_least_recently_used_pin_yields(server: Server) -> None:
    """Two sockets pin both slots; another client's request still runs (it does not wait for
    a socket to close), in the slot of the socket used least recently, and the other socket
    keeps its conversation."""
    with connect(socket_url(server.url)) as old, connect(socket_url(server.url)) as recent:
        first_old = first_turn(old, server, store=False)
        first_recent = first_turn(recent, server, store=False)
        tag = uuid.uuid4().hex
        post(server, instructions=f"A newcomer {tag}.", input=f"Hello {tag}", store=False)
        assert next_turn(recent, server, first_recent) >= first_recent.held
        assert next_turn(old, server, first_old) < first_old.held // 2
