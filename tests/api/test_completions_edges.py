"""/v1/completions at its edges, on a real engine and a real HTTP server: a client that leaves a
non-streaming request stops its generation (as on the other APIs), a failed prompt among several
stops the others, a generation that fails mid-stream ends with an error event and [DONE], and
`echo` + `logprobs` on a request that gives way for KV room mid-prefill still answers.

The engine's sampling hook picks what each prompt generates, by the prompt's first token: a slow
one (a steady token that never ends it), one that fails after a few tokens, or the model's own."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.responses import MODEL, served
from tests.support.sse import parse_sse

SLOW = 1111  # first prompt token: a steady token every STEP_S until max_tokens or the context's end
STEP_S = 0.05  # so a slow generation's 247 tokens take 12 s, whatever the machine's load
FAILING = 2222  # first prompt token: the generation fails after three tokens
STEADY = 1000  # what a slow generation writes (a plain text token)
N_CTX = 256


@dataclass
class Hook:
    """The engine's sampling hook: each prompt's behaviour by its first token."""

    sampled: dict[int, int] = field(default_factory=dict)  # tokens chosen, per behaviour
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, prompt: Sequence[int]) -> Callable[[int], int] | None:
        marker = prompt[0] if prompt else None
        if marker == SLOW:
            return self._counted(SLOW, lambda: time.sleep(STEP_S))
        if marker == FAILING:

            def fail() -> None:
                if self.sampled.get(FAILING, 0) > 3:
                    raise RuntimeError("the test's hook failed this generation")

            return self._counted(FAILING, fail)
        return None

    def _counted(self, marker: int, act: Callable[[], None]) -> Callable[[int], int]:
        def choose(_: int) -> int:
            with self._lock:
                self.sampled[marker] = self.sampled.get(marker, 0) + 1
            act()
            return STEADY

        return choose


@dataclass
class Server:
    url: str
    engine: LlamaEngine
    hook: Hook


@pytest.fixture(scope="module")
def server(tiny_gguf: Path, encoding: HarmonyEncoding) -> Iterator[Server]:
    hook = Hook()
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_slots=2, n_threads=2)
    engine = LlamaEngine(config, sampling_hook=hook)
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    try:
        with served(create_app(Settings(prompt_cache=False), runtime)) as url:
            yield Server(url, engine, hook)
    finally:
        engine.close()


@pytest.fixture(autouse=True)
def _idle(server: Server) -> Iterator[None]:
    server.hook.sampled.clear()
    yield
    wait_idle(server.engine, 120)


def wait_idle(engine: LlamaEngine, seconds: float) -> float:
    """Seconds until the engine runs nothing; fails after `seconds`."""
    start = time.monotonic()
    while engine.load.running:
        assert time.monotonic() - start < seconds, "a generation kept running"
        time.sleep(0.05)
    return time.monotonic() - start


def words(encoding: HarmonyEncoding, n: int) -> list[int]:
    return encoding.encode(" ".join(["word"] * n))[:n]


def wait_sampled(hook: Hook, marker: int, n: int) -> None:
    deadline = time.monotonic() + 60
    while hook.sampled.get(marker, 0) < n:
        assert time.monotonic() < deadline, "the generation did not start"
        time.sleep(0.02)


def test_a_client_that_leaves_stops_its_generation(
    server: Server, encoding: HarmonyEncoding
) -> None:
    prompt = [SLOW, *words(encoding, 8)]  # room for 247 tokens
    payload = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 6000}).encode()
    address = urlsplit(server.url)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    with socket.create_connection((host, port)) as client:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        client.sendall(head.encode() + payload)
        wait_sampled(server.hook, SLOW, 10)  # generating; then the client leaves
    left = server.hook.sampled[SLOW]
    wait_idle(server.engine, 120)
    assert server.hook.sampled[SLOW] < left + 50  # of the 247 it would have written


def test_one_failed_prompt_stops_the_others(server: Server, encoding: HarmonyEncoding) -> None:
    prompts = [[SLOW, *words(encoding, 8)], [FAILING, *words(encoding, 8)]]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 6000}
    response = httpx.post(f"{server.url}/completions", json=body, timeout=60)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert "the test's hook failed" in error["message"]
    wait_idle(server.engine, 120)
    assert server.hook.sampled[SLOW] < 100  # of the 247 it would have written


def test_a_stream_that_fails_ends_with_an_error_and_done(
    server: Server, encoding: HarmonyEncoding
) -> None:
    body = {"model": MODEL, "prompt": [FAILING, *words(encoding, 8)], "stream": True}
    body["max_tokens"] = 50
    with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        datas = [event.data for event in parse_sse(response.iter_lines())]
    assert datas[-1] == "[DONE]"
    texts = [json.loads(d)["choices"][0]["text"] for d in datas[:-2]]
    assert "".join(texts)  # it had started: the failure came mid-stream
    error = json.loads(datas[-2])["error"]
    assert error["type"] == "server_error"
    assert "the test's hook failed" in error["message"]


def test_echo_with_logprobs_when_the_request_gives_way_mid_prefill(
    server: Server, encoding: HarmonyEncoding
) -> None:
    """A generation fills most of the cache; a prompt scored with `echo` runs out of room part
    way through its prefill and gives way: its answer is the prompt, scored as far as it was
    evaluated (null beyond), and finish_reason `length`, not a 500."""
    filler = {"model": MODEL, "prompt": [SLOW, *words(encoding, 8)], "max_tokens": 6000}
    background = threading.Thread(
        target=lambda: httpx.post(f"{server.url}/completions", json=filler, timeout=60)
    )
    background.start()
    try:
        wait_sampled(server.hook, SLOW, 150)
        prompt = words(encoding, 150)
        body = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0}
        response = httpx.post(f"{server.url}/completions", json=body, timeout=60)
    finally:
        background.join(timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["text"] == encoding.decode(prompt)
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt)
    scored = [v for v in logprobs["token_logprobs"][1:] if v is not None]
    assert 0 < len(scored) < len(prompt) - 1  # scored as far as it was evaluated
    assert logprobs["token_logprobs"][1 : 1 + len(scored)] == scored
