"""The prompt cache on disk across a real restart of `gpt-oss-server serve` (tiny GGUF).

A Codex-shaped first request (the developer prompt, tools and environment of a real Codex 0.171
request, ≈7k tokens) is served, the server gets SIGTERM and exits; a second server on the same
cache directory serves a new conversation with the same start: its usage reports the shared
prefix as cached, only the new user message is evaluated, and /metrics counts the disk hit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.serving import server_process
from server.bench.procs import ServerProcess
from server.engine.disk_cache.kv_files import SUFFIX
from tests.support.prompt_cache import disk_metrics, usage

pytestmark = pytest.mark.slow  # starts and restarts `gpt-oss-server serve` processes


def server(model: Path, tmp_path: Path, kv: Path) -> ServerProcess:
    options = ("--n-ctx", "16384", "--n-threads", "2", "--prompt-cache-dir", str(kv))
    return server_process(model, tmp_path, *options)


def test_a_new_conversation_after_a_restart_starts_from_disk(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    kv = tmp_path / "kv"
    with server(tiny_gguf, tmp_path, kv) as first:
        cold = usage(first, "A")
        assert cold["input_tokens_details"]["cached_tokens"] == 0
        before = disk_metrics(first)
    assert before["gpt_oss_prompt_cache_disk_misses_total"] == 1
    assert before["gpt_oss_prompt_cache_disk_written_bytes_total"] > 0
    assert first.ended is not None
    assert first.ended.returncode == 0  # SIGTERM: a graceful shutdown
    assert len(list(kv.glob(f"*{SUFFIX}"))) >= 2  # save points, and the conversation itself

    with server(tiny_gguf, tmp_path, kv) as second:
        warm = usage(second, "B")
        metrics = disk_metrics(second)
    prompt, cached = warm["input_tokens"], warm["input_tokens_details"]["cached_tokens"]
    assert prompt == cold["input_tokens"] > 6000
    # everything up to the new user message's text came from disk; its ≈12 tokens are evaluated
    assert 0 < prompt - cached <= 16
    assert metrics["gpt_oss_prompt_cache_disk_hits_total"] == 1
    assert metrics["gpt_oss_prompt_cache_disk_read_bytes_total"] > 0
