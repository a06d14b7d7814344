"""The load test (`python -m server.bench.load`) on the tiny synthetic GGUF, with small numbers:
the server runs as a child process, and the report's invariants must all hold, the burst
phase's included (12 simultaneous requests against 2 sequences + 1 waiting place)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.bench.load.runner import LoadTestOptions, run_load_test

pytestmark = pytest.mark.slow  # a server process under load

REQUESTS = 24


def test_load_test_invariants(tiny_gguf: Path, tmp_path: Path) -> None:
    options = LoadTestOptions(
        model=tiny_gguf,
        requests=REQUESTS,
        concurrency=4,
        max_tokens=12,
        burst=0,  # the burst phase has a test of its own, with a small bound
        out=tmp_path,
        n_ctx=4096,
        n_threads=2,
        rss_tolerance=0.25,  # few requests: the allocator's first growth is not a leak
        startup_timeout_s=120,
    )
    report, status = run_load_test(options)
    summary = report["summary"]
    failed = [name for name, ok in report["invariants"].items() if not ok]
    assert not failed, (failed, summary)
    assert status == 0
    assert summary["requests"] == REQUESTS
    assert sum(n for kind in summary["by_kind_and_status"].values() for n in kind.values()) == (
        REQUESTS
    )
    assert summary["status_5xx"] == 0
    assert summary["streams_cancelled"] >= 1
    streams_read = summary["streams"] - summary["streams_cancelled"]
    assert summary["streams_with_terminal_event"] == streams_read
    assert set(summary["by_kind_and_status"]) == {
        "chat/json",
        "chat/stream",
        "responses/json",
        "responses/stream",
    }
    assert report["rss"]["before_bytes"] > 0
    assert (tmp_path / "load-test.json").is_file()


def test_burst_accepts_exactly_the_bound(tiny_gguf: Path, tmp_path: Path) -> None:
    """12 requests at once against 2 sequences + 1 waiting place: 3 accepted, 9 refused."""
    options = LoadTestOptions(
        model=tiny_gguf,
        requests=0,  # only the warm-up, then the burst
        out=tmp_path,
        n_slots=2,
        max_waiting=1,
        burst=12,
        n_ctx=8192,
        n_threads=2,
        rss_tolerance=0.25,
        startup_timeout_s=120,
    )
    report, status = run_load_test(options)
    failed = [name for name, ok in report["invariants"].items() if not ok]
    burst = report["burst"]
    assert not failed, (failed, burst)
    assert status == 0
    assert burst["accepted"] == 3, burst
    assert burst["refused"] == burst["refused_with_retry_after"] == 9, burst
    assert burst["queue_depth_max"] == 1, burst  # reached, never passed
    assert burst["refused_counted_by_server"] == 9, burst
    assert report["summary"]["status_5xx"] == 0
