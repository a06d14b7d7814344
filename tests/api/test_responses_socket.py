"""The Responses WebSocket on /v1/responses: a real socket (uvicorn on 127.0.0.1, the websockets
client) to the server's app on the real tiny engine, forced scripts choosing the output."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from devkit.forced import ForcedScript
from server.api.responses.socket import MAX_MESSAGE_HEADER
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.responses import MODEL, served
from tests.support.responses_socket import (
    create,
    receive_until_end,
    refused,
    send_create,
    socket_url,
)

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
CALL = (
    "<|channel|>analysis<|message|>SOCKET-THOUGHT<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
    '<|message|>{"cmd":"ls"}<|call|>'
)
ANSWER = "<|channel|>final<|message|>Two files.<|return|>"
LIMIT = 8192  # --max-request-bytes of the server under test: the socket's message limit
KEY = "socket-test-key"


@contextmanager
def server(runtime: Runtime, tmp_path: Path, **settings: Any) -> Iterator[str]:
    """The app served on a free loopback port, its store under `tmp_path`: its /v1 URL."""
    config = Settings(
        responses_store_path=tmp_path / f"store-{uuid.uuid4().hex}.sqlite3",
        max_request_bytes=LIMIT,
        # no keepalive events: waiting for an event that never comes ends in the recv timeout
        responses_keepalive_s=3600,
        **settings,
    )
    with served(create_app(config, runtime)) as url:
        yield url


@pytest.fixture(scope="module")
def url(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with server(runtime, tmp_path_factory.mktemp("socket")) as base:
        yield base


@pytest.fixture
def ws(url: str) -> Iterator[ClientConnection]:
    with connect(socket_url(url)) as connection:
        yield connection


def handshake_status(uri: str, **options: Any) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body of a refused handshake (fails if it is accepted)."""
    with pytest.raises(InvalidStatus) as refusal, connect(uri, **options):
        pass
    response = refusal.value.response
    return response.status_code, json.loads(response.body or b"{}")


def test_tool_round_continues_by_previous_response_id_with_store_false(
    ws: ClientConnection, url: str, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    output = forced.push(CALL)
    first = create(
        ws,
        input=[{"role": "user", "content": f"List files {uuid.uuid4().hex}"}],
        tools=TOOLS,
        store=False,
    )
    first_prompt = forced.prompts[-1]
    assert first.terminal["type"] == "response.completed"
    (call,) = [item for item in first.items if item["type"] == "function_call"]
    forced.push(ANSWER)
    second = create(
        ws,
        previous_response_id=first.terminal["response"]["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "a\nb"}],
        tools=TOOLS,
        store=False,
    )
    prompt = forced.prompts[-1]
    # the first round's prompt and exactly the tokens it sampled, then only the tool output
    assert prompt[: len(first_prompt) + len(output)] == first_prompt + output
    assert encoding.decode_utf8(prompt[len(first_prompt) + len(output) :]) == (
        "<|start|>functions.exec_command to=assistant<|channel|>commentary<|message|>a\nb<|end|>"
        "<|start|>assistant"
    )
    usage = second.terminal["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= len(first_prompt) + len(output) - 1
    assert second.items[-1]["content"][0]["text"] == "Two files."
    for response in (first, second):  # store: false: the socket alone held them
        got = httpx.get(f"{url}/responses/{response.terminal['response']['id']}")
        assert got.status_code == 404


def test_a_failed_create_leaves_the_socket_usable(
    ws: ClientConnection, forced: ForcedScript
) -> None:
    before = len(forced.prompts)
    error = refused(ws, previous_response_id="resp_nope", input="Hi")
    assert error["status"] == 404
    assert error["error"]["type"] == "not_found_error"
    assert error["error"]["param"] == "previous_response_id"
    assert refused(ws, input=[{"type": "no_such_item"}])["status"] == 400
    ws.send("not json")
    (bad,) = receive_until_end(ws)
    assert (bad["type"], bad["status"]) == ("error", 400)
    assert len(forced.prompts) == before  # refused before anything was generated
    forced.push("<|channel|>final<|message|>Still here.<|return|>")
    checked = create(ws, input="Hi")
    assert checked.items[-1]["content"][0]["text"] == "Still here."


def test_a_second_create_while_one_runs_is_refused(
    ws: ClientConnection, forced: ForcedScript
) -> None:
    forced.push("<|channel|>final<|message|>First.<|return|>")
    with forced.held():  # the first response cannot end until the block does
        send_create(ws, input=f"One {uuid.uuid4().hex}")
        send_create(ws, input="Two")
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] != "error":
            seen.append(json.loads(ws.recv(timeout=60)))
        pong = ws.ping()  # the socket answers pings while a response runs
        assert pong.wait(timeout=30)
    error = seen.pop()
    assert (error["status"], error["error"]["code"]) == (409, "response_in_progress")
    rest = receive_until_end(ws)
    events = seen + rest
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "First."
    assert forced.pending == 0  # one generation: the second create started none


def test_messages_over_the_announced_limit_are_refused(url: str, forced: ForcedScript) -> None:
    with connect(socket_url(url)) as ws:
        assert ws.response is not None
        assert ws.response.headers[MAX_MESSAGE_HEADER] == str(LIMIT)
        error = refused(ws, input="x" * LIMIT, max_output_tokens=16)  # short if it ran
        assert (error["status"], error["error"]["code"]) == (413, "request_too_large")
        forced.push("<|channel|>final<|message|>Small is fine.<|return|>")
        assert create(ws, input="y" * 100).items[-1]["content"][0]["text"] == "Small is fine."


def test_a_warm_up_generates_nothing_and_is_continued(
    ws: ClientConnection, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    before = len(forced.prompts)
    developer = {"role": "developer", "content": f"Warm {uuid.uuid4().hex}"}
    send_create(ws, input=[developer], tools=TOOLS, generate=False, store=False)
    warm = receive_until_end(ws)
    assert [e["type"] for e in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert warm[-1]["response"]["output"] == []
    assert len(forced.prompts) == before  # nothing was generated
    forced.push(ANSWER)
    create(
        ws,
        previous_response_id=warm[-1]["response"]["id"],
        input=[{"role": "user", "content": "Hi"}],
        tools=TOOLS,
        store=False,
    )
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert developer["content"] in prompt
    assert prompt.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


def test_foreign_host_or_origin_cannot_open_the_socket(url: str) -> None:
    uri = socket_url(url)
    port = httpx.URL(url).port
    assert port is not None
    # a page whose name was re-pointed at this machine (DNS rebinding) names its own host
    with socket.create_connection(("127.0.0.1", port)) as raw:
        status, body = handshake_status(f"ws://rebound.example:{port}/v1/responses", sock=raw)
    assert (status, body["error"]["code"]) == (400, "invalid_host")
    status, body = handshake_status(uri, origin=Origin("http://evil.example"))
    assert (status, body["error"]["code"]) == (403, "cross_origin_request")
    status, _ = handshake_status(uri, origin=Origin(f"http://127.0.0.1:{port + 1}"))  # a port
    assert status == 403
    with connect(uri, origin=Origin(f"http://127.0.0.1:{port}")):  # the server's own page may
        pass


def test_the_api_key_is_checked_at_the_handshake(
    runtime: Runtime, tmp_path: Path, forced: ForcedScript
) -> None:
    with server(runtime, tmp_path, api_key=KEY) as base:
        uri = socket_url(base)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": KEY + "x"}):
            status, body = handshake_status(uri, additional_headers=headers)
            assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        forced.push("<|channel|>final<|message|>Keyed.<|return|>")
        with connect(uri, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            assert create(ws, input="Hi").items[-1]["content"][0]["text"] == "Keyed."


def test_no_websocket_answers_426_and_http_still_serves(
    runtime: Runtime, tmp_path: Path, forced: ForcedScript
) -> None:
    with server(runtime, tmp_path, websocket=False) as base:
        status, body = handshake_status(socket_url(base))
        assert (status, body["error"]["code"]) == (426, "websocket_disabled")
        forced.push("<|channel|>final<|message|>Over HTTP.<|return|>")
        answer = httpx.post(f"{base}/responses", json={"model": MODEL, "input": "Hi"}, timeout=60)
        assert answer.json()["output"][-1]["content"][0]["text"] == "Over HTTP."
