"""Several machines on one: the tiny model split between this CPU and llama.cpp RPC hosts.

Two `gpt-oss-server rpc-worker` processes listen on 127.0.0.1 (ggml's RPC server from the same
llama-cpp-python build); the model's layers go to the local CPU and to both workers, and greedy
output must be the local-only output token for token: in the engine, and through chat and
responses, streaming and not. A worker killed mid-stream ends the stream with an error naming
it, turns /health to 503 and refuses new requests with 503, while the server keeps answering;
one killed under a non-streamed request gets it a 503, the model is unloaded, and once the host
is back the next request loads it again.
Start-up refuses a host nothing listens on, one that never answers (bounded by --rpc-timeout-s)
and one that speaks another protocol version.

The build must have RPC (`python scripts/install_llama_cpp.py`); without it the tests skip,
unless GPT_OSS_REQUIRE_RPC=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import llama_cpp.llama_cpp as lc
import pytest

from devkit.serving import free_port, server_process
from server.bench.procs import ServerProcess, serve_command, start_rpc_worker

pytestmark = pytest.mark.slow  # worker and server processes

SPLIT = ("--n-gpu-layers", "2", "--n-threads", "1")  # layer 0 here, layer 1 and output remote


@pytest.fixture(scope="module", autouse=True)
def _rpc_build() -> None:
    if lc.llama_supports_rpc():
        return
    reason = "this llama-cpp-python build has no RPC backend: python scripts/install_llama_cpp.py"
    if os.environ.get("GPT_OSS_REQUIRE_RPC") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


class Worker:
    """A `gpt-oss-server rpc-worker` child on 127.0.0.1."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process = start_rpc_worker(self.port, 1, log_path)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started = [Worker(tmp_path / f"worker-{i}.log") for i in range(2)]
    yield started
    for worker in started:
        worker.kill()


def rpc_flag(workers: list[Worker]) -> tuple[str, str]:
    return "--rpc", ",".join(worker.endpoint for worker in workers)


# the system message's date pinned: the prompt is the same tokens on any day
DATE = "2026-01-01"


def server(model: Path, tmp_path: Path, *options: str) -> ServerProcess:
    return server_process(
        model, tmp_path, "--n-ctx", "4096", "--no-prompt-cache", "--conversation-date", DATE,
        *options,
    )  # fmt: skip


def greedy_tokens(model: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.rpc_tokens", str(model), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_greedy_tokens_with_layers_on_rpc_hosts_equal_local(
    tiny_gguf: Path, workers: list[Worker]
) -> None:
    local = greedy_tokens(tiny_gguf, "0")
    split = greedy_tokens(tiny_gguf, "2", ",".join(worker.endpoint for worker in workers))
    assert split["layers"] == {"0": "CPU", "1": "RPC0", "2": "RPC1"}  # llama.cpp's own log
    plan = "\n".join(split["placement"])  # what the start-up log promised
    assert f"RPC0 on {workers[0].endpoint}: layer 1" in plan
    assert f"RPC1 on {workers[1].endpoint}: the output" in plan
    assert "CPU on this host: layer 0" in plan
    assert len(local["tokens"]) == 48
    assert split["tokens"] == local["tokens"]


CHAT = {
    "model": "gpt-oss-tiny",
    "messages": [{"role": "user", "content": "Tell me about the sea."}],
    "max_tokens": 40,
    "temperature": 0,
}
RESPONSES = {
    "model": "gpt-oss-tiny",
    "input": "Tell me about the sea.",
    "max_output_tokens": 40,
    "temperature": 0,
    "store": False,
}


def chat_text(base: str, stream: bool) -> str:
    url = f"{base}/v1/chat/completions"
    if not stream:
        message = httpx.post(url, json=CHAT, timeout=120).json()["choices"][0]["message"]
        return f"{message.get('reasoning')}|{message.get('content')}"
    reasoning, content = [], []
    for data in sse_data(url, {**CHAT, "stream": True}):
        if data == "[DONE]":
            break
        delta = json.loads(data)["choices"][0]["delta"]
        reasoning.append(delta.get("reasoning") or "")
        content.append(delta.get("content") or "")
    return f"{''.join(reasoning) or None}|{''.join(content) or None}"


def responses_output(base: str, stream: bool) -> list[Any]:
    url = f"{base}/v1/responses"
    if not stream:
        return list(httpx.post(url, json=RESPONSES, timeout=120).json()["output"])
    for data in sse_data(url, {**RESPONSES, "stream": True}):
        event = json.loads(data)
        if event["type"] in ("response.completed", "response.incomplete"):
            return list(event["response"]["output"])
    raise AssertionError("the stream has no terminal response event")


def sse_data(url: str, body: dict[str, Any]) -> Iterator[str]:
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield line.removeprefix("data: ")


def without_ids(output: list[Any]) -> list[Any]:
    return [{k: v for k, v in item.items() if k != "id"} for item in output]


def test_chat_and_responses_through_rpc_hosts_equal_local(
    tiny_gguf: Path, workers: list[Worker], tmp_path: Path
) -> None:
    results: list[dict[str, Any]] = []
    for options in ((), (*SPLIT, *rpc_flag(workers))):
        with server(tiny_gguf, tmp_path, "--n-threads", "1", *options) as proc:
            base = proc.health_url.removesuffix("/health")
            # the same request once before: every compared one then reuses the same cached
            # prefix and evaluates the same tail. The first request of a server evaluates the
            # whole prompt in one batch, the next ones its last token only, and kernels round
            # differently by batch shape: greedy picks from the tiny model's random weights
            # then parted after some tokens on some prompts (seen on some dates' prompts)
            chat_text(base, False)
            results.append(
                {
                    "chat": [chat_text(base, stream) for stream in (False, True)],
                    "responses": [
                        without_ids(responses_output(base, stream)) for stream in (False, True)
                    ],
                    "log": proc.log_path.read_text(),
                }
            )
    local, split = results
    assert local["chat"][0] == local["chat"][1] != "None|None"
    assert split["chat"] == local["chat"]
    assert local["responses"][0] == local["responses"][1]
    assert split["responses"] == local["responses"]
    assert f"RPC0 on {workers[0].endpoint}: layer 1" in split["log"]  # the banner, per host


def test_a_host_that_drops_mid_stream_ends_the_request_and_health(
    tiny_gguf: Path, workers: list[Worker], tmp_path: Path
) -> None:
    with server(tiny_gguf, tmp_path, *SPLIT, *rpc_flag(workers)) as proc:
        base = proc.health_url.removesuffix("/health")
        body = {**CHAT, "max_tokens": 3000, "temperature": 1, "stream": True}
        payloads = []
        for data in sse_data(f"{base}/v1/chat/completions", body):
            payloads.append(data)
            if len(payloads) == 5:
                threading.Thread(target=workers[1].kill).start()
        assert payloads[-1] == "[DONE]"
        last = json.loads(payloads[-2])  # the error envelope, just before [DONE]
        assert f"RPC host {workers[1].endpoint} stopped answering" in last["error"]["message"]
        health = httpx.get(proc.health_url, timeout=10)
        assert health.status_code == 503
        assert workers[1].endpoint in health.json()["error"]
        refused = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=30)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "engine_unavailable"
        assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 200
        assert workers[1].endpoint in proc.log_path.read_text()
        proc.stop()
        assert proc.ended is not None
        assert proc.ended.returncode == 0


def active(base: str) -> bool:
    return bool(re.search(r"^gpt_oss_active_sequences\S* [1-9]", metrics(base), re.M))


def metrics(base: str) -> str:
    return httpx.get(f"{base}/metrics", timeout=10).text


def cut_by_a_drop(base: str, worker: Worker) -> httpx.Response:
    """A non-streamed request's answer when `worker` is killed while it is generated."""
    body = {**CHAT, "max_tokens": 3000, "temperature": 1}
    answers: list[httpx.Response] = []
    client = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
        )
    )
    client.start()
    deadline = time.monotonic() + 60
    while not active(base):
        assert time.monotonic() < deadline
        assert client.is_alive()
        time.sleep(0.02)
    worker.kill()
    client.join(60)
    (answer,) = answers
    return answer


def test_a_dropped_host_unloads_the_model_until_it_is_back(
    tiny_gguf: Path, workers: list[Worker], tmp_path: Path
) -> None:
    """A host killed under a non-streamed request: that request gets 503 with the reason (not
    a 500), the model is unloaded (/health 503 with the reason), each API refuses in its own
    shape while the host is gone, and once it is back on its port the next request connects
    the hosts anew (the surviving one hung up on first: it serves one client at a time),
    loads the model again and is answered."""
    options = (*SPLIT, *rpc_flag(workers), "--log-level", "info")
    gone = workers[1].endpoint
    with server(tiny_gguf, tmp_path, *options) as proc:
        base = proc.health_url.removesuffix("/health")
        cut = cut_by_a_drop(base, workers[1])
        assert cut.status_code == 503, cut.text
        assert cut.json()["error"]["code"] == "engine_unavailable"
        assert f"RPC host {gone} stopped answering" in cut.json()["error"]["message"]

        deadline = time.monotonic() + 60
        while httpx.get(proc.health_url, timeout=10).json()["model_state"] != "unloaded":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        health = httpx.get(proc.health_url, timeout=10)
        assert health.status_code == 503
        assert gone in health.json()["error"]
        assert "gpt_oss_model_unloads_total 1.0" in metrics(base)
        refused = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=30)
        assert refused.status_code == 503
        assert gone in refused.json()["error"]["message"]
        anthropic_body = {"model": "gpt-oss-tiny", "max_tokens": 8,
                          "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        claude = httpx.post(f"{base}/v1/messages", json=anthropic_body, timeout=30)
        assert claude.status_code == 503
        assert claude.json()["error"]["type"] == "overloaded_error"
        assert gone in claude.json()["error"]["message"]

        workers[1].process = start_rpc_worker(workers[1].port, 1, workers[1].log_path)
        answered = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=120)
        while answered.status_code != 200:  # after the backoff (5 s)
            assert time.monotonic() < deadline + 60, answered.text
            time.sleep(0.5)
            answered = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=120)
        health = httpx.get(proc.health_url, timeout=10)
        assert (health.status_code, health.json()["model_state"]) == (200, "loaded")
        log = proc.log_path.read_text()
        assert "unloading it, a request loads it again" in log
        assert f"RPC host {gone}: connected again" in log
        assert f"RPC host {workers[0].endpoint}: connected again" in log
        proc.stop()
    assert proc.ended is not None
    assert proc.ended.returncode == 0


def test_sigterm_while_loading_ends_the_waiting_stream_at_once(
    tiny_gguf: Path, workers: list[Worker], tmp_path: Path
) -> None:
    """A reload after an idle unload, held mid-load by an RPC host that is stopped (SIGSTOP):
    SIGTERM ends the stream waiting for the load with its terminal error at once (not after
    the drain's grace), and once the host goes on the load stops and the server exits without
    starting the stream on the model it loaded."""
    options = (*SPLIT, *rpc_flag(workers), "--idle-unload", "1s", "--shutdown-grace-s", "20",
               "--log-level", "info")  # fmt: skip
    with server(tiny_gguf, tmp_path, *options) as proc:
        base = proc.health_url.removesuffix("/health")

        def model_state() -> str:
            return str(httpx.get(proc.health_url, timeout=10).json()["model_state"])

        deadline = time.monotonic() + 60
        while model_state() != "unloaded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(workers[0].process.pid, signal.SIGSTOP)
        try:
            events: list[str] = []
            body = {**CHAT, "stream": True}
            client = threading.Thread(
                target=lambda: events.extend(sse_data(f"{base}/v1/chat/completions", body))
            )
            client.start()
            while model_state() != "loading":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(1.0)  # the load waits for the stopped host
            assert model_state() == "loading"
            stopper = threading.Thread(target=proc.stop)  # SIGTERM, then waits for the exit
            stopper.start()
            client.join(10)  # well within the grace of 20 s
            assert not client.is_alive()
            assert events[-1] == "[DONE]"
            assert "shutting down" in json.loads(events[-2])["error"]["message"]
        finally:
            os.kill(workers[0].process.pid, signal.SIGCONT)
        started = time.monotonic()
        stopper.join(70)
        stopped_s = time.monotonic() - started
    assert proc.ended is not None
    assert proc.ended.returncode == 0
    assert stopped_s < 15, stopped_s  # the load stopped once the host went on
    logged = proc.log_path.read_text()
    assert "the model's load stopped for the shutdown" in logged
    assert "model loaded again" not in logged


REGISTERED = """
import sys
from server.engine.ggml import functions
from server.engine.rpc import backend
for device in backend.connect([sys.argv[1]], 5.0):
    print(device.endpoint, functions().ggml_backend_dev_description(device.handle).decode())
"""


def test_a_host_name_is_resolved_once_and_ggml_gets_the_checked_address(
    workers: list[Worker],
) -> None:
    """ggml would resolve a name again at every (re)connection, after the checks: it must be
    given the address the checks used (the device's description is what ggml connects to)."""
    named = f"localhost:{workers[0].port}"
    done = subprocess.run(
        [sys.executable, "-c", REGISTERED, named],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines
    assert all(line == f"{named} 127.0.0.1:{workers[0].port}" for line in lines), lines


@pytest.mark.parametrize("prompt_cache", [False, True])
def test_sigterm_exits_promptly_after_a_host_stopped_while_idle(
    tiny_gguf: Path, workers: list[Worker], tmp_path: Path, prompt_cache: bool
) -> None:
    """Saving the conversations (their KV state is partly on the host) and freeing the model
    need the host that is gone: ggml aborts on the engine thread, the abort hook parks it, and
    the shutdown must not wait for it."""
    kv = ("--prompt-cache-dir", str(tmp_path / "kv"), "--prompt-cache-min-tokens", "16")
    cache = kv if prompt_cache else ("--no-prompt-cache",)
    options = ("--n-ctx", "4096", *cache, *SPLIT, *rpc_flag(workers))
    with server_process(tiny_gguf, tmp_path, *options) as proc:
        base = proc.health_url.removesuffix("/health")
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=120).is_success
        for worker in workers:  # stopped while the server is idle: nothing notices yet
            worker.kill()  # (worker 0 holds layer 1's KV cache, worker 1 the output layer)
        started = time.monotonic()
        proc.stop()  # SIGTERM; SIGKILL after a minute
        stopped_s = time.monotonic() - started
    assert proc.ended is not None
    assert stopped_s < 15, f"SIGTERM took {stopped_s:.0f} s (exit status {proc.ended.returncode})"
    assert proc.ended.returncode == 0
    logged = proc.log_path.read_text()
    assert all(f"{worker.endpoint}" in logged for worker in workers)  # it says what happened


def run_serve(model: Path, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = serve_command(model, free_port(), "--cache-dir", str(tmp_path / "c"), *options)
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_start_up_names_a_host_nothing_listens_on(tiny_gguf: Path, tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = run_serve(tiny_gguf, tmp_path, "--rpc", endpoint)
    assert done.returncode == 1
    assert f"RPC host {endpoint} refused the connection" in done.stderr
    assert time.monotonic() - started < 60


def test_start_up_gives_up_on_a_host_that_never_answers(tiny_gguf: Path, tmp_path: Path) -> None:
    """A listener whose queue is full drops new connections: connecting would hang for the
    kernel's minutes; the start-up stops after --rpc-timeout-s instead."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        queued = [socket.socket() for _ in range(3)]
        for client in queued:
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", listener.getsockname()[1]))
        started = time.monotonic()
        done = run_serve(tiny_gguf, tmp_path, "--rpc", endpoint, "--rpc-timeout-s", "2")
        for client in queued:
            client.close()
    assert done.returncode == 1
    assert f"RPC host {endpoint} did not answer within 2 s" in done.stderr
    assert time.monotonic() - started < 60


def test_start_up_names_a_host_of_another_protocol_version(tiny_gguf: Path, tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        answering = threading.Thread(target=answer_hello_as_version_6, args=(listener,))
        answering.start()
        done = run_serve(tiny_gguf, tmp_path, "--rpc", endpoint, "--rpc-timeout-s", "5")
        answering.join(timeout=30)
    assert done.returncode == 1
    assert f"RPC host {endpoint} refused the handshake" in done.stderr
    assert "version mismatch: 6.0.0" in done.stderr


def answer_hello_as_version_6(listener: socket.socket) -> None:
    """An RPC peer of protocol 6: answers the HELLO command (the reachability check's bare
    connection first) with version 6.0.0 and the capability bytes it was sent."""
    listener.settimeout(60)
    for _ in range(2):
        connection, _ = listener.accept()
        with connection:
            header = recv_exactly(connection, 9)  # command byte, request size (u64)
            if len(header) < 9:
                continue  # the bare TCP check closed without a command
            caps = recv_exactly(connection, int.from_bytes(header[1:9], "little"))
            answer = bytes([6, 0, 0, 0]) + bytes(len(caps))
            connection.sendall(len(answer).to_bytes(8, "little") + answer)
            connection.recv(1)  # wait for the client to give up


def recv_exactly(connection: socket.socket, size: int) -> bytes:
    """`size` bytes, or fewer only where the peer closed: ggml's client sends the command byte,
    the size and the payload as separate writes, so one recv may hold just the first of them."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data
