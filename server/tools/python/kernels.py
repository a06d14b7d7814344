"""The python tool's kernels: one sandboxed process per conversation, reaped when idle.

`Kernel` is one sandbox running kernel.py in its own cgroup: `execute(code)` thaws the sandbox,
sends the code, reads what it prints (at most `Limits.output_bytes` kept, the rest counted) until
the call's marker, and then checks the end before it takes it. The marker is printed by the
kernel, in whose process the code runs: the code can read it from the kernel's frames and print
it, so it proves nothing. The end is taken only when the sandbox holds nothing but bubblewrap's
two processes and the kernel, and the kernel's main thread is blocked reading its next request
(its /proc `syscall`: `read` on the request descriptor); then the whole cgroup is frozen, what
was written before the freeze is read as this call's output, and nothing of the sandbox runs
until the next call thaws it. A call whose end does not pass the check (the code wrote the marker
itself and went on) kills the sandbox. So the code of a call runs only within calls, each bounded
by its wall-clock limit, and no output of one call is read as a later one's. Without a cgroup
(the operator's choice) nothing is frozen: the check still holds the main thread, but threads
the code started may run between calls, bounded by the kernel's CPU-time limit only.

A call past its time whose kernel did not end it itself, a kernel that dies (memory, CPU time)
and a forged end all kill every process of the cgroup: the conversation's next call starts a
fresh kernel, and the output says its state was lost. /mnt/data is saved to the conversation's
host directory after every call and before a kill (files.py), and the next kernel starts with it.
`KernelPool` keeps at most `max_kernels` of them, one per conversation, closes those idle longer
than `idle_s`, and removes their directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from server.tools.python import files, seccomp
from server.tools.python.cgroups import Cgroup
from server.tools.python.sandbox import REQUEST_FD, SCRATCH_MOUNT, SandboxConfig

log = logging.getLogger(__name__)

READ_CHUNK = 65536
KILL_GRACE_S = 3.0  # past the timeout, the kernel's own interruption has this long to work
SETTLE_S = 0.5  # after its marker, the kernel has at least this long to be back at its loop
FORGED = "the code wrote the call's end itself and kept running, so the python session was killed"


@dataclass(frozen=True, slots=True)
class Execution:
    """What one call printed, and how it ended. `ended` is None when the kernel finished the
    code and lives on; otherwise why the sandbox is gone (its state with it)."""

    output: str
    omitted_bytes: int = 0
    ended: str | None = None

    @property
    def ok(self) -> bool:
        return self.ended is None


class Kernel:
    """One sandbox running kernel.py for one conversation."""

    def __init__(self, config: SandboxConfig, scratch: Path) -> None:
        self._config = config
        self.scratch = scratch  # the conversation's files as saved after its last call
        self._process: asyncio.subprocess.Process | None = None
        self._output: int | None = None  # the read end of the sandbox's stdout and stderr
        self.cgroup: Cgroup | None = None
        self.lock = asyncio.Lock()  # one call at a time
        self.last_used = time.monotonic()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        config = self._config
        if config.cgroups is not None:
            self.cgroup = await asyncio.to_thread(config.cgroups.create, config.limits.for_group())
        seccomp_fd = seccomp.program_fd()
        read_end, write_end = os.pipe()
        try:
            self._process = await asyncio.create_subprocess_exec(
                *config.command(self.scratch, seccomp_fd, self.cgroup),
                stdin=asyncio.subprocess.PIPE,
                stdout=write_end,
                stderr=write_end,
                pass_fds=(seccomp_fd,),
                start_new_session=True,
            )
        except BaseException:
            os.close(read_end)
            if self.cgroup is not None:
                await asyncio.to_thread(self.cgroup.remove)
                self.cgroup = None
            raise
        finally:
            os.close(write_end)
            os.close(seccomp_fd)
        os.set_blocking(read_end, False)
        self._output = read_end

    async def execute(self, code: str, timeout_s: float) -> Execution:
        """Run `code`; never raises for anything the code does."""
        if not self.alive:
            try:
                await self.start()
            except OSError as exc:  # no cgroup or process could be made now
                log.warning("a python sandbox did not start: %s", exc)
                return Execution(output="", ended=f"the python session could not start ({exc})")
        process = self._process
        assert process is not None
        assert process.stdin is not None
        assert self._output is not None
        self.last_used = time.monotonic()
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.thaw)
        marker = f"\x1e{secrets.token_hex(16)}\x1e".encode("ascii")
        request = {"code": code, "marker": marker.decode("ascii"), "timeout": timeout_s}
        try:
            process.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died: reading finds the end and says so
        reader = _OutputReader(marker, self._config.limits.output_bytes)
        deadline = time.monotonic() + timeout_s + KILL_GRACE_S
        try:
            finished = await asyncio.wait_for(
                reader.read(self._output), timeout=timeout_s + KILL_GRACE_S
            )
        except asyncio.CancelledError:  # the caller gave up: the code must not run on unseen
            await asyncio.shield(self.close())
            raise
        except TimeoutError:
            await self.close(save=True)
            return reader.result(
                f"the code ran past the {timeout_s:g} s time limit and did not stop when "
                "interrupted, so the python session was killed"
            )
        finally:
            self.last_used = time.monotonic()
        if finished:
            settled = await asyncio.to_thread(self._settle, deadline)
            reader.drain(self._output)  # all that was written before the freeze is this call's
            if not settled:
                await self.close(save=True)
                return reader.result(FORGED)
            await asyncio.to_thread(self._save)
            return reader.result(None)
        status = await process.wait()
        await self.close()
        return reader.result(_death(status, self._config.limits.cpu_seconds))

    def _processes(self) -> tuple[int, int] | None:
        """bubblewrap's init and the kernel, when they are all the sandbox holds besides
        bubblewrap itself; None otherwise."""
        assert self._process is not None
        try:
            inside = psutil.Process(self._process.pid).children(recursive=True)
            if len(inside) != 2:
                return None
            init = [p for p in inside if p.ppid() == self._process.pid]
            kernel = [p for p in inside if p.ppid() != self._process.pid]
        except psutil.Error:
            return None
        if len(init) != 1 or len(kernel) != 1 or kernel[0].ppid() != init[0].pid:
            return None
        return init[0].pid, kernel[0].pid

    def _waiting(self) -> bool:
        """The kernel alone in the sandbox and blocked reading its next request."""
        found = self._processes()
        if found is None:
            return False
        try:
            with open(f"/proc/{found[1]}/syscall", encoding="ascii") as file:
                call = file.read().split()
        except OSError:
            return False
        return len(call) > 1 and call[0] == str(READ) and int(call[1], 16) == REQUEST_FD

    def _settle(self, deadline: float) -> bool:
        """After the marker: wait for the kernel to be back at its request loop (until the
        call's own deadline, or a moment past the marker), freeze the cgroup, and check again;
        False when the end was not the kernel's own."""
        deadline = max(deadline, time.monotonic() + SETTLE_S)
        pause = 0.001
        while not self._waiting():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        if self.cgroup is not None:
            self.cgroup.freeze()
        return self._waiting()

    def _save(self) -> None:
        """Copy the sandbox's /mnt/data out (its processes stopped or blocked)."""
        found = self._processes() if self._process is not None else None
        init = found[0] if found else self._init_pid()
        if init is None:
            return
        with contextlib.suppress(OSError):  # a sandbox that ends meanwhile keeps what was saved
            files.save(Path(f"/proc/{init}/root{SCRATCH_MOUNT}"), self.scratch, self._config.uid)

    def _init_pid(self) -> int | None:
        assert self._process is not None
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self._process.pid).children()
            if len(children) == 1:
                return int(children[0].pid)
        return None

    async def close(self, *, save: bool = False) -> None:
        """Kill the sandbox (its whole cgroup), saving its files first when `save`, and wait."""
        process = self._process
        if process is not None and process.returncode is None:
            if self.cgroup is not None:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(self.cgroup.freeze)
            if save:
                await asyncio.to_thread(self._save)
        if self.cgroup is not None:
            try:
                await asyncio.to_thread(self.cgroup.remove)
            except OSError as exc:  # its processes are killed below all the same
                log.warning("a python sandbox's cgroup was not removed: %s", exc)
            self.cgroup = None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._output is not None:
            os.close(self._output)
            self._output = None


READ = seccomp.syscall_number("read")


def _death(status: int, cpu_seconds: int) -> str:
    if status > 128:  # bwrap's init passes a killed child's signal on as 128 + its number
        status = 128 - status
    if status in (-signal.SIGXCPU, -signal.SIGKILL):
        return (
            "the python session was killed: it used up its CPU time "
            f"({cpu_seconds} s for the conversation) or its memory"
        )
    if status < 0:
        return f"the python session was killed by signal {signal.Signals(-status).name}"
    return f"the python session ended (exit status {status})"


async def _read_chunk(fd: int) -> bytes:
    """The next bytes of the non-blocking pipe `fd` (b"" at its end)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return os.read(fd, READ_CHUNK)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _set_once, ready)
            try:
                await ready
            finally:
                loop.remove_reader(fd)


def _set_once(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


class _OutputReader:
    """Reads a call's output up to its marker, keeping at most `limit` bytes."""

    def __init__(self, marker: bytes, limit: int) -> None:
        self._marker = marker
        self._limit = limit
        self._kept = bytearray()
        self._tail = b""  # the last bytes read, where a marker may have begun
        self.omitted = 0

    async def read(self, fd: int) -> bool:
        """True at the marker, False at the end of the output (the kernel died)."""
        while True:
            chunk = await _read_chunk(fd)
            if not chunk:
                self._keep(self._tail)
                self._tail = b""
                return False
            data = self._tail + chunk
            at = data.find(self._marker)
            if at >= 0:  # anything after it was still written in this call
                self._keep(data[:at] + data[at + len(self._marker) :])
                self._tail = b""
                return True
            cut = max(0, len(data) - len(self._marker) + 1)
            self._keep(data[:cut])
            self._tail = data[cut:]

    def drain(self, fd: int) -> None:
        """Keep what is still in the pipe (its writers stopped) as this call's output."""
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._keep(chunk.replace(self._marker, b""))

    def _keep(self, data: bytes) -> None:
        room = self._limit - len(self._kept)
        self._kept += data[: max(room, 0)]
        self.omitted += max(len(data) - max(room, 0), 0)

    def result(self, ended: str | None) -> Execution:
        text = self._kept.decode("utf-8", errors="replace")
        return Execution(output=text, omitted_bytes=self.omitted, ended=ended)


class KernelPool:
    """At most `max_kernels` kernels, one per conversation; idle ones reaped."""

    def __init__(self, config: SandboxConfig, *, max_kernels: int = 4, idle_s: float = 600.0):
        self._config = config
        self.max_kernels = max_kernels
        self.idle_s = idle_s
        self._kernels: dict[str, Kernel] = {}
        self._root: Path | None = None
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, key: str) -> bool:
        return key in self._kernels

    def _scratch_root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="gpt-oss-python-"))
            # a root server's sandbox user must reach its own directory inside (not list others)
            self._root.chmod(0o711 if self._config.uid is not None else 0o700)
        return self._root

    async def kernel(self, key: str) -> Kernel | None:
        """The conversation's kernel (made if new); None when all are busy and none can go."""
        self._start_reaper()
        found = self._kernels.get(key)
        if found is not None:
            return found
        if len(self._kernels) >= self.max_kernels:
            idle = [(k.last_used, name) for name, k in self._kernels.items() if not k.lock.locked()]
            if not idle:
                return None
            await self.discard(min(idle)[1])  # the least recently used
        scratch = self._scratch_root() / secrets.token_hex(12)
        self._config.prepare_scratch(scratch)
        kernel = Kernel(self._config, scratch)
        self._kernels[key] = kernel
        return kernel

    async def run(self, key: str, code: str, timeout_s: float) -> Execution | None:
        """Run `code` in the conversation's kernel, after its earlier calls; None when every
        kernel is busy."""
        for _ in range(3):  # the kernel found may be reaped before its lock is taken
            kernel = await self.kernel(key)
            if kernel is None:
                return None
            async with kernel.lock:
                if self._kernels.get(key) is kernel:
                    return await kernel.execute(code, timeout_s)
        return None

    async def discard(self, key: str) -> None:
        kernel = self._kernels.pop(key, None)
        if kernel is None:
            return
        await kernel.close()
        await asyncio.to_thread(shutil.rmtree, kernel.scratch, True)

    async def reap(self) -> list[str]:
        """Close the kernels idle longer than idle_s; their keys."""
        now = time.monotonic()
        idle = [
            key
            for key, kernel in self._kernels.items()
            if not kernel.lock.locked() and now - kernel.last_used > self.idle_s
        ]
        for key in idle:
            await self.discard(key)
        return idle

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever(), name="python-kernel-reaper")

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(max(min(self.idle_s / 4, 30.0), 0.05))
            await self.reap()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for key in list(self._kernels):
            await self.discard(key)
        if self._root is not None:
            await asyncio.to_thread(shutil.rmtree, self._root, True)
            self._root = None
