"""Servers for tests and scripts: an app served by uvicorn on 127.0.0.1 in a thread of this
process (their own engine, forced scripts, settings), or `gpt-oss-server serve` as a child
process on a free port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from server.bench.http_path import free_port
from server.bench.procs import ServerProcess, serve_command

__all__ = ["free_port", "served", "server_process"]


@contextmanager
def served(app: ASGIApp, log_level: str = "warning", start_s: float = 30.0) -> Iterator[str]:
    """`app` served on a free loopback port; yields its root URL (`http://127.0.0.1:PORT`).
    Raises if uvicorn has not started within start_s; on exit asks it to stop and waits."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


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
