"""Graceful shutdown of a real `gpt-oss-server serve` process on the tiny GGUF.

SIGTERM arrives while a streaming request is in flight: the server stops accepting connections,
the stream ends with its terminal event, and the process exits with status 0. The start-up
banner and the Docker health check are exercised on the same process.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from typing import Any

import httpx
import pytest

from server.ops.healthcheck import healthy
from server.ops.settings import Settings
from tests.support.serve_process import ServerProcess

pytestmark = pytest.mark.slow  # server processes and signals


def stream_and_terminate(server: ServerProcess, max_tokens: int) -> tuple[list[str], int]:
    """Stream a chat completion, SIGTERM the server after its first token; every data payload
    and how many arrived after the signal."""
    body = {
        "model": "gpt-oss-tiny",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    payloads: list[str] = []
    signalled_at: int | None = None
    url = f"{server.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            payloads.append(line.removeprefix("data: "))
            if signalled_at is None and len(payloads) >= 3:  # the role chunk, then tokens
                server.process.send_signal(signal.SIGTERM)
                signalled_at = len(payloads)
                assert_refuses_connections(server.port)
    assert signalled_at is not None, "the stream ended before the signal could be sent"
    return payloads, len(payloads) - signalled_at


def assert_refuses_connections(port: int, timeout: float = 10) -> None:
    """After the signal the listening socket closes (the stream in flight goes on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return
        time.sleep(0.05)
    pytest.fail("the server still accepts connections after SIGTERM")


def test_sigterm_lets_the_stream_in_flight_finish(start_server: Any) -> None:
    server = start_server("--shutdown-grace-s", "120")
    payloads, after_signal = stream_and_terminate(server, max_tokens=400)
    assert payloads[-1] == "[DONE]"
    final = json.loads(payloads[-2])
    assert final["choices"][0]["finish_reason"] in ("length", "stop")
    assert after_signal > 1
    assert server.process.wait(timeout=60) == 0
    log = server.log()
    assert "Waiting for connections to close" in log  # the request was in flight at SIGTERM
    assert "gpt-oss-server stopped" in log
    assert "stopping their generations" not in log


def test_generation_past_the_grace_period_gets_its_terminal_event(start_server: Any) -> None:
    server = start_server("--shutdown-grace-s", "0.5")
    started = time.monotonic()
    payloads, after_signal = stream_and_terminate(server, max_tokens=3000)
    assert after_signal >= 1
    # the stream cut by the shutdown ends with its error envelope, then [DONE]: never a
    # finish_reason, never a cut connection
    assert payloads[-1] == "[DONE]"
    assert "shut down" in json.loads(payloads[-2])["error"]["message"]
    chunks = [json.loads(payload) for payload in payloads[:-2]]
    assert not [c for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
    assert server.process.wait(timeout=60) == 0
    assert time.monotonic() - started < 60
    assert "stopping their generations" in server.log()


def test_banner_and_health_check(start_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = start_server()
    log = server.log()
    assert "gpt-oss-server is ready" in log
    assert f"API        http://127.0.0.1:{server.port}/v1" in log
    assert "placement  CPU only: 2 layers" in log
    assert f"curl -s http://127.0.0.1:{server.port}/v1/chat/completions" in log
    assert "from openai import OpenAI" in log
    monkeypatch.setenv("GPT_OSS_PORT", str(server.port))
    assert healthy(Settings())
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=60) == 0
    assert not healthy(Settings())
