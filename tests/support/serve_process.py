"""`gpt-oss-server serve` on the tiny GGUF as a child process the test signals and kills: the
`start_server` fixture starts one with extra flags and waits for /health."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from devkit.serving import free_port


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def command() -> list[str]:
    script = Path(sys.executable).with_name("gpt-oss-server")
    return [str(script)] if script.exists() else [sys.executable, "-m", "server"]


@pytest.fixture
def start_server(tiny_gguf: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[ServerProcess] = []

    def start(*extra: str) -> ServerProcess:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPT_OSS_")}
        env["HF_HUB_OFFLINE"] = "1"
        args = [
            *command(),
            "serve",
            *("--model", str(tiny_gguf), "--port", str(port), "--n-ctx", "4096"),
            *("--n-threads", "2", "--cache-dir", str(tmp_path / "cache")),
            *("--responses-store-path", str(tmp_path / "responses.sqlite3"), *extra),
        ]
        log_path = tmp_path / f"server-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        server = ServerProcess(process, port, log_path)
        started.append(server)
        wait_until_healthy(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def wait_until_healthy(server: ServerProcess, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"the server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the server did not answer /health within {timeout} s:\n{server.log()}")
