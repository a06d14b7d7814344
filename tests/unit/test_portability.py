"""Nothing on the serving or benchmark path is Linux-only: with Linux's own functions removed
(as on macOS), the thread default and the machine facts still answer."""

from __future__ import annotations

import os
import platform
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
    assert machine.OtherLoad().cores() >= 0.0


def test_peak_rss_units() -> None:
    assert maxrss_bytes(1000, "darwin") == 1000  # bytes on macOS
    assert maxrss_bytes(1000, "linux") == 1024000  # KiB on Linux
