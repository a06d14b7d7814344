"""The first request to a fresh `gpt-oss-server serve` imports nothing: every module it needs is
loaded at start-up, not while a client waits for its first token (numpy's random generators
and anyio's asyncio backend were: 6 and 4 ms of the first streamed reply)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # a server process


def test_the_first_streamed_reply_imports_no_module(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # each import's line on stderr
    server = start_server()
    before = server.log()
    assert "import time:" in before  # the start-up's imports are written
    body = {
        "model": "gpt-oss-tiny",
        "messages": [{"role": "user", "content": "Hello"}],
        "stream": True,
        "max_tokens": 4,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    after = server.log()[len(before) :]
    assert [line for line in after.splitlines() if line.startswith("import time:")] == []
