"""Facts about the machine, and the guard that keeps two model copies out of memory."""

from __future__ import annotations

import logging
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

from server.bench.plan import BenchError

log = logging.getLogger(__name__)

GIB = 1024**3
MEMORY_MARGIN = GIB


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    values: dict[str, int] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            values[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(n_threads: int) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "threads": n_threads,
        "memory_gib": round(meminfo().get("MemTotal", 0) / GIB, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat, all CPUs)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """CPU seconds a live process has used, all its threads (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
        available = meminfo().get("MemAvailable", 0)
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
