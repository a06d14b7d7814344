"""The load test (`python -m devkit.load_test`) on the tiny synthetic GGUF, with small numbers:
the server runs as a child process, and the report's invariants must all hold: the count mode,
the burst phase (12 simultaneous requests against 2 sequences + 1 waiting place), and a short
soak (mixed traffic on all three APIs for a time, tool loops, a burst, the RSS curve)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.load_test.mix import ENDPOINTS
from devkit.load_test.runner import LoadTestOptions, run_load_test

pytestmark = pytest.mark.slow  # a server process under load

REQUESTS = 24
KINDS = {f"{endpoint}/{mode}" for endpoint in ENDPOINTS for mode in ("json", "stream")}


def test_load_test_invariants(tiny_gguf: Path, tmp_path: Path) -> None:
    options = LoadTestOptions(
        model=tiny_gguf,
        requests=REQUESTS,
        concurrency=4,
        max_tokens=12,
        loop_share=0.0,  # tool loops (in the warm-up too): the soak test's
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
    assert set(summary["by_kind_and_status"]) == KINDS
    assert report["rss"]["before_bytes"] > 0
    assert (tmp_path / "load-test.json").is_file()


def test_burst_accepts_exactly_the_bound(tiny_gguf: Path, tmp_path: Path) -> None:
    """12 requests at once against 2 sequences + 1 waiting place: 3 accepted, 9 refused."""
    options = LoadTestOptions(
        model=tiny_gguf,
        requests=0,  # only the warm-up, then the burst
        loop_share=0.0,  # no tool loops, in the warm-up neither
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


SOAK_S = 30.0


def test_soak_mode(tiny_gguf: Path, tmp_path: Path) -> None:
    """CI's short soak: 30 s of mixed traffic (three APIs, streaming and not, tool loops,
    cancellations) with one burst beyond the queue in the middle; every invariant holds, the RSS
    curve is sampled and flat after its warm-up, and the engine ends idle."""
    options = LoadTestOptions(
        model=tiny_gguf,
        duration_s=SOAK_S,
        concurrency=4,
        max_tokens=12,
        loop_share=0.4,
        n_slots=4,
        max_waiting=4,  # room beyond the concurrency: a worker's request is never refused
        burst=12,
        burst_every_s=15.0,  # one burst, at 15 s
        rss_every_s=1.0,
        warmup_s=8.0,
        rss_tolerance=0.10,  # a short curve: the allocator may still settle
        out=tmp_path,
        n_ctx=8192,
        n_threads=2,
        startup_timeout_s=120,
    )
    report, status = run_load_test(options)
    summary, rss = report["summary"], report["rss"]
    failed = [name for name, ok in report["invariants"].items() if not ok]
    assert not failed, (failed, summary, {k: v for k, v in rss.items() if k != "curve"})
    assert status == 0
    assert report["mode"] == "soak"
    assert report["elapsed_s"] >= SOAK_S
    assert "rss_flat_after_warmup" in report["invariants"]
    assert summary["status_5xx"] == 0
    assert not summary["transport_errors"]
    assert (
        summary["streams_with_terminal_event"] == summary["streams"] - summary["streams_cancelled"]
    )
    # the warm-up sends every kind and a tool loop on each API; the soak adds its own mix
    warm_loops = report["warmup"]["tool_loops"]
    assert all(warm_loops[endpoint]["loops"] == 1 for endpoint in ENDPOINTS), warm_loops
    # a forced tool call answered with its result as the next round (a forced round may also end
    # at its limit in a preamble: the model is random, so some loop, not every one)
    loops = [report["warmup"]["tool_loops"], summary["tool_loops"]]
    depths = [int(n) for part in loops for e in ENDPOINTS for n in part[e]["loops_by_rounds"]]
    assert max(depths) >= 2, loops
    assert summary["requests"] > 0
    assert len(report["bursts"]) == 1
    burst = report["bursts"][0]
    assert burst["accepted"] == burst["bound"] == 8, burst
    assert burst["refused"] == burst["refused_with_retry_after"] == 4, burst
    assert rss["samples"] >= SOAK_S / 2, rss
    assert rss["samples_after_warmup"] >= 3, rss
    assert rss["flat"] is True
    assert isinstance(rss["slope_mib_per_hour"], float)
    assert report["admission"]["active_sequences_at_end"] == 0
    assert report["admission"]["queue_depth_at_end"] == 0
    assert report["server_exit_status"] == 0
