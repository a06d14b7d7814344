"""End-to-end: uvicorn on 127.0.0.1 and real clients."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkit.serving import served
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings

# fixtures for every e2e test: a `serve` process; the pinned Codex and Claude Code binaries
from tests.support.claude_code import claude_binary  # noqa: F401
from tests.support.codex import codex_binary  # noqa: F401
from tests.support.serve_process import start_server  # noqa: F401


@pytest.fixture(scope="session")
def base_url(runtime: Runtime) -> Iterator[str]:
    """The app on the session's engine, served by uvicorn in a thread."""
    with served(create_app(Settings(), runtime)) as root:
        yield f"{root}/v1"
