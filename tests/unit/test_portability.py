"""Nothing on the serving or benchmark path is Linux-only: with Linux's own functions removed
(as on macOS), the thread default and the machine facts still answer."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.bench import machine
from server.bench.procs import maxrss_bytes
from server.engine.base import default_threads


def test_default_threads_without_sched_getaffinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert default_threads() == os.cpu_count()
    assert machine.machine_info(3)["cpus_usable"] == os.cpu_count()


def test_machine_facts_without_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")  # no sysctl here: the fallback
    name = machine.cpu_model(tmp_path / "no-cpuinfo")
    assert name == (platform.processor() or platform.machine())
    info = machine.machine_info(2)
    assert info["threads"] == 2
    assert info["memory_gib"] > 0
    assert len(info["load_average_start"]) == 3


def test_memory_cpu_times_and_rss() -> None:
    total, available = machine.memory()
    assert 0 < available <= total
    busy, ours = machine.busy_cpu_s(), machine.self_cpu_s()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # burn a little CPU
        pass
    assert machine.busy_cpu_s() > busy
    assert machine.self_cpu_s() >= ours + 0.15
    assert machine.process_cpu_s(os.getpid()) >= machine.self_cpu_s() - 0.05
    assert machine.rss_bytes(os.getpid()) > 10 * 1024**2


def test_other_load_leaves_out_the_processes_it_is_told_are_ours() -> None:
    """A child burning CPU: counted as other load, unless its pid is given as ours; the two
    readings over the same time differ by the child's CPU time."""
    burn = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        theirs, ours = machine.OtherLoad(), machine.OtherLoad((child.pid,))
        started = time.perf_counter()
        child_before = machine.process_cpu_s(child.pid)
        time.sleep(1.0)
        child_cpu = machine.process_cpu_s(child.pid) - child_before
        with_child, without_child = theirs.cores(), ours.cores()
        elapsed = time.perf_counter() - started
    finally:
        child.kill()
        child.wait()
    assert child_cpu > 0.05  # it ran (on a loaded machine, for part of the time)
    assert with_child - without_child == pytest.approx(child_cpu / elapsed, abs=0.05)


def test_peak_rss_units() -> None:
    assert maxrss_bytes(1000, "darwin") == 1000  # bytes on macOS
    assert maxrss_bytes(1000, "linux") == 1024000  # KiB on Linux
