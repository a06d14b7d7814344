"""Facts about the machine (psutil: Linux and macOS alike), and the guard that keeps two model
copies out of memory."""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from server.bench.plan import BenchError
from server.engine.base import default_threads

log = logging.getLogger(__name__)

GIB = 1024**3
MEMORY_MARGIN = GIB


def memory() -> tuple[int, int]:
    """(total, available) system memory in bytes."""
    found = psutil.virtual_memory()
    return int(found.total), int(found.available)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name: /proc/cpuinfo on Linux, sysctl on macOS, else the platform's."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            found = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=5, check=True,
            )  # fmt: skip
            if found.stdout.strip():
                return found.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def machine_info(n_threads: int) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpus_usable": default_threads(),
        "threads": n_threads,
        "memory_gib": round(memory()[0] / GIB, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_start": load_average(),
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in psutil.getloadavg()]


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all CPUs)."""
    times = psutil.cpu_times()
    guest = getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)  # inside user
    idle = times.idle + getattr(times, "iowait", 0.0)
    return float(sum(times) - guest - idle)


def self_cpu_s() -> float:
    return process_cpu_s(os.getpid())


def process_cpu_s(pid: int) -> float:
    """CPU seconds a live process has used, all its threads (user + system)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def rss_bytes(pid: int) -> int:
    """A live process's resident set now."""
    return int(psutil.Process(pid).memory_info().rss)


class OtherLoad:
    """How many CPUs processes other than ours kept busy between construction and `cores()`.

    Ours: this process and the live processes `pids`. On a shared machine this tells which
    measurements ran beside other work (llama.cpp's threads wait for each other at every
    operation, so decode slows down far more than the CPU time taken away).
    """

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self._pids = pids
        self._start = time.perf_counter()
        self._busy = busy_cpu_s()
        self._ours = self._our_cpu_s()

    def _our_cpu_s(self) -> float:
        return self_cpu_s() + sum(process_cpu_s(pid) for pid in self._pids)

    def cores(self, extra_ours_s: float = 0.0) -> float:
        """Mean CPUs busy with other work; `extra_ours_s`: CPU time of our ended children."""
        elapsed = time.perf_counter() - self._start
        others = busy_cpu_s() - self._busy - (self._our_cpu_s() - self._ours) - extra_ours_s
        return round(max(others, 0.0) / elapsed, 3) if elapsed > 0 else 0.0


def wait_for_memory(model_path: Path, timeout_s: float) -> None:
    """Block until the model file plus a margin fits in available memory, or raise."""
    needed = model_path.stat().st_size + MEMORY_MARGIN
    deadline = time.monotonic() + timeout_s
    while True:
        available = memory()[1]
        if available >= needed:
            return
        if time.monotonic() >= deadline:
            raise BenchError(
                f"only {available / GIB:.1f} GiB of memory available, {needed / GIB:.1f} GiB "
                "needed: is another copy of the model loaded?"
            )
        log.warning(
            "waiting for memory: %.1f GiB available, %.1f GiB needed",
            available / GIB,
            needed / GIB,
        )
        time.sleep(10.0)
