"""What the python tool's tests share: a sandbox configured with small limits (skipped where
none can run, failed instead under GPT_OSS_REQUIRE_SANDBOX=1), a tool run in one event loop,
and a call's context."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from server.tools.base import ToolContext
from server.tools.python.sandbox import Limits, SandboxConfig, SandboxUnavailable, configure
from server.tools.python.tool import PythonTool


def sandbox_config(limits: Limits) -> SandboxConfig:
    try:
        return configure(limits=limits)
    except SandboxUnavailable as exc:
        if os.environ.get("GPT_OSS_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{exc} (GPT_OSS_REQUIRE_SANDBOX=1)")
        pytest.skip(str(exc))


def run_with(
    config: SandboxConfig, body: Callable[[PythonTool], Awaitable[None]], **pool: float
) -> None:
    async def main() -> None:
        tool = PythonTool(config, **pool)  # type: ignore[arg-type]
        try:
            await body(tool)
        finally:
            await tool.close()

    asyncio.run(main())


def ctx(conversation: str = "c1", max_output_chars: int = 4000) -> ToolContext:
    return ToolContext(
        response_id="resp_1",
        conversation_id=conversation,
        timeout_s=30,
        max_output_chars=max_output_chars,
    )


@contextlib.contextmanager
def host_secret() -> Iterator[Path]:
    """A file where the host keeps real data, outside every temporary directory (the sandbox
    has a /tmp of its own, so a secret there proves nothing): under /var/lib for root, under
    ~/.local/state otherwise; removed afterwards."""
    base = Path("/var/lib") if os.geteuid() == 0 else Path.home() / ".local" / "state"
    directory = base / f"gpt-oss-sandbox-test-{secrets.token_hex(6)}"
    directory.mkdir(parents=True, mode=0o755)
    try:
        secret = directory / "secret.txt"
        secret.write_text("host data")
        secret.chmod(0o644)  # readable by anyone on the host: only the sandbox keeps it out
        yield secret
    finally:
        shutil.rmtree(directory, ignore_errors=True)
