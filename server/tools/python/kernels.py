"""The python tool's kernels: one sandboxed process per conversation, reaped when idle.

`Kernel` is one sandbox running kernel.py: `execute(code)` sends the code, reads what it prints
until the call's marker (at most `Limits.output_bytes` kept, the rest counted), and kills the
sandbox when the call runs past its time and the kernel's own interruption did not end it, or
when the kernel dies (memory, CPU time): the conversation's next call starts a fresh one, and
the output says its state was lost. `KernelPool` keeps at most `max_kernels` of them, one per
conversation, closes those idle longer than `idle_s`, and removes their scratch directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from server.tools.python.sandbox import SandboxConfig

READ_CHUNK = 65536
KILL_GRACE_S = 3.0  # past the timeout, the kernel's own interruption has this long to work


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
        self.scratch = scratch
        self._process: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()  # one call at a time
        self.last_used = time.monotonic()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            *self._config.command(self.scratch),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            user=self._config.uid,
            group=self._config.uid,
            extra_groups=self._config.extra_groups,
        )

    async def execute(self, code: str, timeout_s: float) -> Execution:
        """Run `code`; never raises for anything the code does."""
        if not self.alive:
            await self.start()
        process = self._process
        assert process is not None
        assert process.stdin is not None
        assert process.stdout is not None
        self.last_used = time.monotonic()
        marker = f"\x1e{secrets.token_hex(16)}\x1e".encode("ascii")
        request = {"code": code, "marker": marker.decode("ascii"), "timeout": timeout_s}
        try:
            process.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died: reading finds the end and says so
        reader = _OutputReader(marker, self._config.limits.output_bytes)
        try:
            finished = await asyncio.wait_for(
                reader.read(process.stdout), timeout=timeout_s + KILL_GRACE_S
            )
        except asyncio.CancelledError:  # the caller gave up: the code must not run on unseen
            await asyncio.shield(self.close())
            raise
        except asyncio.TimeoutError:
            await self.close()
            return reader.result(
                f"the code ran past the {timeout_s:g} s time limit and did not stop when "
                "interrupted, so the python session was killed"
            )
        finally:
            self.last_used = time.monotonic()
        if finished:
            return reader.result(None)
        status = await process.wait()
        await self.close()
        return reader.result(_death(status, self._config.limits.cpu_seconds))

    async def close(self) -> None:
        """Kill the sandbox (everything in it dies with bwrap's init) and wait for it."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


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


class _OutputReader:
    """Reads a call's output up to its marker, keeping at most `limit` bytes."""

    def __init__(self, marker: bytes, limit: int) -> None:
        self._marker = marker
        self._limit = limit
        self._kept = bytearray()
        self._tail = b""  # the last bytes read, where a marker may have begun
        self.omitted = 0

    async def read(self, stream: asyncio.StreamReader) -> bool:
        """True at the marker, False at the end of the stream (the kernel died)."""
        while True:
            chunk = await stream.read(READ_CHUNK)
            if not chunk:
                self._keep(self._tail)
                return False
            data = self._tail + chunk
            at = data.find(self._marker)
            if at >= 0:
                self._keep(data[:at])
                return True
            cut = max(0, len(data) - len(self._marker) + 1)
            self._keep(data[:cut])
            self._tail = data[cut:]

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
