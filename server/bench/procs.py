"""Child processes with their own peak memory: run-to-end commands and HTTP servers.

Children are reaped with `os.wait4`, whose resource usage gives the child's peak resident set
(`ru_maxrss`, the kernel's high-water mark that /proc/<pid>/status shows as VmHWM), so each
path's peak is its own process's, not the benchmark driver's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from server.bench.machine import OtherLoad
from server.bench.plan import BenchError, PathRun
from server.engine.rpc.hosts import RpcError, reachable

log = logging.getLogger(__name__)

STOP_GRACE_S = 60.0


@dataclass(frozen=True, slots=True)
class Ended:
    """How a child ended, with its resource usage."""

    returncode: int
    peak_rss_bytes: int = 0
    cpu_s: float = 0.0  # user + system CPU time


@dataclass(frozen=True, slots=True)
class ChildResult:
    ended: Ended
    stdout: str
    other_cpus: float  # mean CPUs busy with other processes while it ran


def run_to_end(command: list[str], log_path: Path) -> ChildResult:
    """Run a command to its end; stdout is returned, stderr appended to `log_path`."""
    log.info("running %s", " ".join(command))
    load = OtherLoad()
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file)
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        proc.stdout.close()
        ended = _reap(proc, block=True)
    assert ended is not None
    return ChildResult(ended, stdout, load.cores(ended.cpu_s))


def run_counted(run: PathRun, command: list[str], log_path: Path, name: str) -> ChildResult:
    """Run one of a path's commands to its end, counted on `run` (the command, the child's peak
    memory and CPU time); a command that fails is a BenchError with its log's tail."""
    run.commands.append(command)
    result = run_to_end(command, log_path)
    ended = result.ended
    run.add_child(ended.peak_rss_bytes, ended.cpu_s)
    if ended.returncode != 0:
        raise BenchError(f"{name} exited with {ended.returncode}:\n{log_tail(log_path)}")
    return result


def serve_command(model: Path | str, port: int, *options: str) -> list[str]:
    """`gpt-oss-server serve` on 127.0.0.1:`port` in this interpreter, with further flags."""
    return [sys.executable, "-m", "server", "serve", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), *options]  # fmt: skip


def log_tail(log_path: Path, n_chars: int = 2000) -> str:
    try:
        return log_path.read_text(errors="replace")[-n_chars:]
    except OSError:
        return ""


def _reap(proc: subprocess.Popen[bytes], *, block: bool) -> Ended | None:
    """How the child ended; None if it still runs (block=False)."""
    pid, status, usage = os.wait4(proc.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
    return Ended(proc.returncode, maxrss_bytes(usage.ru_maxrss), usage.ru_utime + usage.ru_stime)


def maxrss_bytes(ru_maxrss: int, system: str = sys.platform) -> int:
    """ru_maxrss in bytes: macOS counts bytes, Linux (and the other Unixes) KiB."""
    return ru_maxrss if system == "darwin" else ru_maxrss * 1024


class ServerProcess:
    """A server child: started, polled until `health_url` answers 200, stopped on exit."""

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        health_url: str,
        timeout_s: float,
        cwd: Path | None = None,  # `python -m server` runs the `server` found there
        *,
        env: dict[str, str] | None = None,  # set in the child's environment besides ours
    ) -> None:
        self.command = command
        self.cwd = cwd
        self.env = env
        self.log_path = log_path
        self.health_url = health_url
        self.timeout_s = timeout_s
        self.load_s = 0.0
        self.ended: Ended | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        log.info("starting %s", " ".join(self.command))
        with self.log_path.open("ab") as log_file:
            self._proc = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.cwd,
                env={**os.environ, **self.env} if self.env else None,
            )
        started = time.perf_counter()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.load_s = time.perf_counter() - started
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            self.ended = _reap(self._proc, block=False)
            if self.ended is not None:
                raise BenchError(
                    f"server exited with status {self.ended.returncode} while starting:\n"
                    f"{log_tail(self.log_path)}"
                )
            try:
                if httpx.get(self.health_url, timeout=5.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise BenchError(f"server not ready after {self.timeout_s:.0f} s: {self.health_url}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; records how it ended."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            self.ended = _reap(proc, block=False)
            if self.ended is not None:
                return
            time.sleep(0.1)
        log.warning("server %d ignored SIGTERM for %.0f s; killing it", proc.pid, STOP_GRACE_S)
        proc.kill()
        self.ended = _reap(proc, block=True)


def measure_server(
    run: PathRun,
    command: list[str],
    port: int,
    log_path: Path,
    timeout_s: float,
    *,
    measure: Callable[[httpx.Client, str, int], None],
) -> None:
    """Start a server listening on 127.0.0.1:`port`, wait for its /health, run
    `measure(client, base_url, pid)`, stop it; its command, load time, peak memory and CPU
    time go to `run` (the last two also when the measurement failed)."""
    run.commands.append(command)
    base = f"http://127.0.0.1:{port}"
    server = ServerProcess(command, log_path, f"{base}/health", timeout_s)
    try:
        with server, httpx.Client() as client:
            run.load_s = server.load_s
            measure(client, base, server.pid)
    finally:
        if server.ended is not None:
            run.add_child(server.ended.peak_rss_bytes, server.ended.cpu_s)


def start_rpc_worker(port: int, threads: int, log_path: Path) -> subprocess.Popen[bytes]:
    """`gpt-oss-server rpc-worker` on 127.0.0.1:`port`, returned once it accepts connections;
    BenchError (with its log) if it exits or is not listening within a minute."""
    command = [sys.executable, "-m", "server", "rpc-worker", "--port", str(port)]
    with log_path.open("ab") as log_file:
        worker = subprocess.Popen(
            [*command, "--threads", str(threads)], stdout=log_file, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            reachable(f"127.0.0.1:{port}", 1.0)
            return worker
        except RpcError as exc:
            if worker.poll() is not None or time.monotonic() > deadline:
                worker.kill()
                worker.wait()
                raise BenchError(f"rpc-worker did not start:\n{log_tail(log_path)}") from exc
            time.sleep(0.1)
