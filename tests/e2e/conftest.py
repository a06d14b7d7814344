"""End-to-end: uvicorn on 127.0.0.1 and real clients."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from server.app import create_app
from server.bench.procs import ServerProcess, serve_command
from server.ops.runtime import Runtime
from server.ops.settings import Settings


def server_process(model: Path, tmp_path: Path, *options: str) -> ServerProcess:
    """`gpt-oss-server serve` on a free port, its caches and response store under `tmp_path`
    (start it with `with`: ready once /health answers)."""
    port = free_port()
    command = serve_command(
        model,
        port,
        *("--cache-dir", str(tmp_path / "cache")),
        *("--responses-store-path", str(tmp_path / f"responses-{port}.sqlite3"), *options),
    )
    health = f"http://127.0.0.1:{port}/health"
    return ServerProcess(command, tmp_path / f"server-{port}.log", health, timeout_s=120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def base_url(runtime: Runtime) -> Iterator[str]:
    """The app on the session's engine, served by uvicorn in a thread."""
    port = free_port()
    config = uvicorn.Config(
        create_app(Settings(), runtime), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)
