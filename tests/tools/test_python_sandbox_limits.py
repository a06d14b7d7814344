"""Each limit of the python tool's sandbox attacked from inside a real sandbox, as hostile code
the model ran would: memory held by many processes, /dev/shm and /mnt/data filled (the latter
across calls and a kernel's death), a fork bomb, busy loops on every core, the host's loopback
and a public address, new user namespaces and system calls a notebook never needs, and a cell
that prints its own call's end marker to run on unseen. Small limits keep each test to seconds.

Without bubblewrap (or where it cannot make namespaces or cgroups) these tests skip, unless
GPT_OSS_REQUIRE_SANDBOX=1 (CI), where that is a failure."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psutil
import pytest

from server.tools.python.sandbox import Limits, SandboxConfig
from server.tools.python.tool import PythonTool
from tests.support.python_sandbox import ctx, host_secret, run_with, sandbox_config

CORES = 0.5
LIMITS = Limits(
    timeout_s=5.0,
    memory_bytes=256 << 20,
    processes=16,
    cpu_cores=CORES,
    shm_bytes=16 << 20,
    data_bytes=32 << 20,
    output_bytes=64 << 10,
)


@pytest.fixture(scope="module")
def sandbox() -> SandboxConfig:
    return sandbox_config(LIMITS)


def last_line(text: str) -> str:
    return text.rstrip("\n").rsplit("\n", 1)[-1]


HOLD_MEMORY = """
import os, time
children = []
for _ in range(3):  # 3 x 100 MiB: each under the limit, together past it
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        block = b'x' * (100 << 20)  # written, so resident
        os.write(w, b'1')
        time.sleep(30)
        os._exit(0)
    os.close(w)
    children.append((pid, r))
for pid, r in children:
    os.read(r, 1)  # b'' when the child was killed before it held its block
time.sleep(0.3)
held = sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid, _ in children)  # alive, holding
print('held', held)
"""


def test_processes_together_cannot_hold_more_than_the_memory_limit(
    sandbox: SandboxConfig,
) -> None:
    async def body(tool: PythonTool) -> None:
        result = await tool.call("python", HOLD_MEMORY, ctx())
        assert "held 3" not in result.text
        assert "held" in result.text or "the python session was killed" in result.text
        assert (await tool.call("python", "1 + 1", ctx())).text == "2\n"

    run_with(sandbox, body)


FILL = """
import os
written = 0
error = None
try:
    for n in range({chunks}):
        with open(f'{directory}/fill-{tag}-{{n}}', 'wb') as f:
            f.write(b'x' * (4 << 20))
        written += 4
except OSError as exc:
    error = exc.strerror
total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk('{directory}') for f in fs)
print(written, error, total >> 20, sep='|')
"""


def test_dev_is_read_only_and_dev_shm_is_sized(sandbox: SandboxConfig) -> None:
    code = FILL.format(chunks=16, directory="/dev/shm", tag="a")  # 64 MiB into 16 MiB
    denied = "try:\n    open('/dev/evil', 'w')\nexcept OSError as exc:\n    print(exc.strerror)"

    async def body(tool: PythonTool) -> None:
        _, error, total = last_line((await tool.call("python", code, ctx())).text).split("|")
        assert int(total) <= 16
        assert error == "No space left on device"
        assert (await tool.call("python", denied, ctx())).text == "Read-only file system\n"

    run_with(sandbox, body)


def test_mnt_data_is_bounded_across_calls_and_kept_across_kernels(
    sandbox: SandboxConfig,
) -> None:
    async def body(tool: PythonTool) -> None:
        first = await tool.call(
            "python", FILL.format(chunks=4, directory="/mnt/data", tag=1), ctx()
        )
        assert last_line(first.text) == "16|None|16"
        died = await tool.call("python", "import os, signal\nos.kill(os.getpid(), 9)", ctx())
        assert "the python session was killed" in died.text
        totals = []
        for tag in (2, 3):  # a new kernel, with the first call's files
            code = FILL.format(chunks=4, directory="/mnt/data", tag=tag)
            said = last_line((await tool.call("python", code, ctx())).text)
            totals.append(int(said.split("|")[-1]))
        assert totals[0] >= 16  # the first call's files survived the kernel's death
        assert max(totals) <= 32
        (kernel,) = tool.pool._kernels.values()
        on_host = sum(f.stat().st_size for f in kernel.scratch.rglob("*") if f.is_file())
        assert 16 << 20 <= on_host <= 32 << 20

    run_with(sandbox, body)


FORK_BOMB = """
import os, time
peak = 0
def count():
    return sum(1 for p in os.listdir('/proc') if p.isdigit())
children = 0
try:
    while True:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.01)
        children += 1
        peak = max(peak, count())
except OSError as exc:
    time.sleep(0.5)
    print(type(exc).__name__, max(peak, count()))
"""


def test_a_fork_bomb_is_held_to_the_process_limit(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        started = time.monotonic()
        result = await tool.call("python", FORK_BOMB, ctx())
        assert time.monotonic() - started < 15
        kind, peak = last_line(result.text).split()
        assert kind == "BlockingIOError"
        assert int(peak) <= LIMITS.processes  # bubblewrap's init and the kernel among them
        after = await tool.call(
            "python", "import os\nsorted(p for p in os.listdir('/proc') if p.isdigit())", ctx()
        )
        assert after.text == "['1', '2']\n"

    run_with(sandbox, body)


BUSY = """
import os, time
cores = max(len(os.sched_getaffinity(0)), 2)
pids = []
for _ in range(cores):
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    pids.append(pid)
def used():
    total = 0
    for pid in pids:
        with open(f'/proc/{pid}/stat') as stat:
            fields = stat.read().rsplit(')', 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf('SC_CLK_TCK')
time.sleep(0.5)
start, begun = used(), time.monotonic()
time.sleep(2.5)
print(round((used() - start) / (time.monotonic() - begun), 2))
"""


def test_busy_loops_on_every_core_share_the_sandboxs_cpu_quota(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        share = float(last_line((await tool.call("python", BUSY, ctx())).text))
        assert share <= CORES * 1.25  # cores' worth of CPU, all processes together

    run_with(sandbox, body)


def test_neither_the_hosts_loopback_nor_a_public_address_is_reachable(
    sandbox: SandboxConfig,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=2)\n"
            "        print('CONNECTED', address)\n"
            "    except OSError as exc:\n"
            "        print(exc.strerror)\n"
            "socket.gethostname()"
        )

        async def body(tool: PythonTool) -> None:
            result = await tool.call("python", code, ctx())
            assert result.text == "Connection refused\nNetwork is unreachable\n'sandbox'\n"

        run_with(sandbox, body)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing came in


NAMESPACES_AND_SYSCALLS = """
import ctypes, errno, subprocess
libc = ctypes.CDLL(None, use_errno=True)
ran = subprocess.run(['unshare', '-Urn', 'id', '-u'], capture_output=True, text=True)
print('unshare -Urn:', ran.returncode, ran.stdout.strip())
def denied(name, *args):
    number = {'ptrace': 101, 'keyctl': 250, 'mount': 165, 'bpf': 321, 'perf_event_open': 298,
              'userfaultfd': 323, 'unshare': 272, 'personality': 135, 'io_uring_setup': 425}[name]
    result = libc.syscall(number, *args)
    return name if result == -1 and ctypes.get_errno() == errno.EPERM else name + ' ALLOWED'
print(*[denied(n, 0, 0, 0, 0) for n in ['ptrace', 'keyctl', 'mount', 'bpf', 'perf_event_open',
        'userfaultfd', 'personality', 'io_uring_setup']], denied('unshare', 0x10000000))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers of x86_64")
def test_no_user_namespace_and_no_denied_system_call(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        result = await tool.call("python", NAMESPACES_AND_SYSCALLS, ctx())
        first, second = result.text.splitlines()[-2:]
        assert first.startswith("unshare -Urn: 1 ")  # refused; as root inside it prints 0
        assert second == (
            "ptrace keyctl mount bpf perf_event_open userfaultfd personality io_uring_setup unshare"
        )

    run_with(sandbox, body)


FIND_MARKER = """
import os, sys
frame = sys._getframe()
while 'request' not in frame.f_locals:
    frame = frame.f_back
marker = frame.f_locals['request']['marker']
print('forged end', flush=True)
os.write(1, marker.encode())
"""


def sandbox_processes(tool: PythonTool) -> list[psutil.Process]:
    (kernel,) = tool.pool._kernels.values()
    process = kernel._process
    if process is None or process.returncode is not None:
        return []
    with_bwrap = psutil.Process(process.pid)
    return [with_bwrap, *with_bwrap.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def test_a_forged_end_marker_does_not_let_the_code_run_on(sandbox: SandboxConfig) -> None:
    spin = FIND_MARKER + "while True:\n    pass\n"

    async def body(tool: PythonTool) -> None:
        await tool.call("python", "kept = 1", ctx())
        started = time.monotonic()
        result = await tool.call("python", spin, ctx())
        assert time.monotonic() - started >= LIMITS.timeout_s  # the forged end was not taken
        assert result.text.startswith("forged end\n")
        assert "ExecutionTimeout" in result.text  # the code was interrupted at its time limit
        processes = sandbox_processes(tool)
        before = cpu_seconds(processes)
        time.sleep(1.0)
        assert cpu_seconds(processes) - before < 0.1  # and nothing of it runs after the call
        assert (await tool.call("python", "kept", ctx())).text == "1\n"

    run_with(sandbox, body)


def test_output_after_a_forged_end_is_not_taken_as_the_next_calls(
    sandbox: SandboxConfig,
) -> None:
    late = FIND_MARKER + "import time\ntime.sleep(0.5)\nprint('LEAKED')\n"

    async def body(tool: PythonTool) -> None:
        first = await tool.call("python", late, ctx())
        second = await tool.call("python", "print('second')", ctx())
        assert second.text == "second\n"
        # the end was taken only once the code was done: what it printed is the first call's
        assert first.text == "forged end\nLEAKED\n"

    run_with(sandbox, body)


def test_a_call_past_its_time_kills_every_process_and_removes_the_cgroup(
    sandbox: SandboxConfig,
) -> None:
    if sandbox.cgroups is None:
        pytest.skip("no cgroup: per-process limits only")
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        while True:\n"
        "            pass\n"
        "    os._exit(0)\n"
        "while True:\n"
        "    pass\n"
    )

    async def body(tool: PythonTool) -> None:
        await tool.call("python", "1", ctx())
        (kernel,) = tool.pool._kernels.values()
        assert kernel.cgroup is not None
        group = kernel.cgroup
        processes = sandbox_processes(tool)
        result = await tool.call("python", code, ctx())
        assert "did not stop when interrupted" in result.text
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)
        assert not any(Path(d).exists() for d in group.dirs.values())

    run_with(sandbox, body)


def test_saving_mnt_data_follows_no_link_out_of_the_sandbox(sandbox: SandboxConfig) -> None:
    with host_secret() as secret:
        plant = (
            "import os\n"
            f"os.symlink({str(secret)!r}, '/mnt/data/leak')\n"
            f"os.symlink({str(secret.parent)!r}, '/mnt/data/dir')\n"
            "os.mkfifo('/mnt/data/fifo')\n"
            "os.mkdir('/mnt/data/sub')\n"
            "open('/mnt/data/sub/kept', 'w').write('mine')\n"
        )
        read = (
            "import os\n"
            "print(sorted(os.listdir('/mnt/data')), open('/mnt/data/sub/kept').read())\n"
            "for path in ['/mnt/data/leak', '/mnt/data/dir/secret.txt']:\n"
            "    print(os.readlink(path) if os.path.islink(path) else '', os.path.exists(path))\n"
        )

        async def body(tool: PythonTool) -> None:
            await tool.call("python", plant, ctx())
            (kernel,) = tool.pool._kernels.values()
            saved = kernel.scratch
            assert os.readlink(saved / "leak") == str(secret)  # a link, as the sandbox made it
            assert (saved / "dir").is_symlink()
            assert not (saved / "fifo").exists()
            await tool.call("python", "import os, signal\nos.kill(os.getpid(), 9)", ctx())
            after = await tool.call("python", read, ctx())  # a new kernel, from what was saved
            assert after.text == (
                "['dir', 'leak', 'sub'] mine\n"
                f"{secret} False\n"  # the link came back, and leads nowhere in the sandbox
                " False\n"
            )

        run_with(sandbox, body)


def test_a_forged_end_of_code_that_will_not_stop_kills_the_sandbox(
    sandbox: SandboxConfig,
) -> None:
    stubborn = FIND_MARKER + (
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    )

    async def body(tool: PythonTool) -> None:
        await tool.call("python", "kept = 1", ctx())
        result = await tool.call("python", stubborn, ctx())
        assert result.is_error
        assert "wrote the call's end itself and kept running" in result.text
        assert sandbox_processes(tool) == []
        assert "NameError" in (await tool.call("python", "kept", ctx())).text

    run_with(sandbox, body)


TICKING = """
import threading, time
ticks = 0
def tick():
    global ticks
    while True:
        time.sleep(0.01)
        ticks += 1
threading.Thread(target=tick, daemon=True).start()
time.sleep(0.2)
ticks
"""


def test_nothing_of_the_sandbox_runs_between_calls(sandbox: SandboxConfig) -> None:
    if sandbox.cgroups is None:
        pytest.skip("no cgroup: threads may run between calls (per-process limits only)")

    async def body(tool: PythonTool) -> None:
        at_end = int((await tool.call("python", TICKING, ctx())).text)
        time.sleep(1.0)  # a hundred ticks, were the thread running
        at_start = int((await tool.call("python", "ticks", ctx())).text)
        assert at_start - at_end < 30

    run_with(sandbox, body)
