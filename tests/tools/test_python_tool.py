"""The python tool in its real bubblewrap sandbox: state across calls, and each way code can
misbehave refused or killed with an output that says so, the calling process unharmed.

Without bubblewrap (or where it cannot make namespaces) these tests skip, unless
GPT_OSS_REQUIRE_SANDBOX=1 (CI), where that is a failure."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.tools.base import ServerTool
from server.tools.python.kernels import KernelPool
from server.tools.python.sandbox import (
    SYSTEM_DIRS,
    SYSTEM_FILES,
    Limits,
    SandboxConfig,
    SandboxUnavailable,
    configure,
)
from server.tools.python.tool import NO_OUTPUT, PythonTool
from tests.support.python_sandbox import ctx, host_secret, run_with, sandbox_config

LIMITS = Limits(timeout_s=3.0, memory_bytes=256 << 20, processes=16, output_bytes=256 << 10)


@pytest.fixture(scope="module")
def sandbox() -> SandboxConfig:
    return sandbox_config(LIMITS)


def test_is_a_server_tool_with_harmonys_python_namespace(sandbox: SandboxConfig) -> None:
    tool = PythonTool(sandbox)
    assert isinstance(tool, ServerTool)
    described = tool.description()
    assert (described.name, described.builtin, described.tools) == ("python", "python", ())
    assert "stateful Jupyter notebook" in described.description
    assert "time out after 3.0 seconds" in described.description
    assert "Internet access for this session is disabled" in described.description


def test_state_is_kept_across_calls_and_the_last_expression_is_shown(
    sandbox: SandboxConfig,
) -> None:
    async def body(tool: PythonTool) -> None:
        first = await tool.call("python", "x = 20\ny = x + 1\ny * 2", ctx())
        assert (first.text, first.is_error) == ("42\n", False)
        assert first.item["code"] == "x = 20\ny = x + 1\ny * 2"
        assert first.item["outputs"] == [{"type": "logs", "logs": "42\n"}]
        second = await tool.call("python", "print('y is', y)\ny + 1", ctx())
        assert second.text == "y is 21\n22\n"
        assert (await tool.call("python", "_", ctx())).text == "22\n"  # the last value shown
        assert (await tool.call("python", "z = 1", ctx())).text == NO_OUTPUT
        # another conversation has its own kernel
        other = await tool.call("python", "y", ctx("c2"))
        assert "NameError: name 'y' is not defined" in other.text
        # the model's JSON-wrapped code is recovered
        assert (await tool.call("python", '{"code": "y * 3"}', ctx())).text == "63\n"

    run_with(sandbox, body)


def test_errors_print_a_traceback_of_the_cell_only(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        result = await tool.call("python", "def f(n):\n    return 1 / n\nf(0)", ctx())
        assert result.text.startswith("Traceback (most recent call last):\n")
        assert 'File "<cell 1>", line 2, in f' in result.text
        assert "ZeroDivisionError: division by zero" in result.text
        assert 'File "<string>"' not in result.text  # the kernel's own frames
        syntax = await tool.call("python", "def (:", ctx())
        assert "SyntaxError" in syntax.text
        assert not result.is_error  # the tool worked; the code did not
        assert not syntax.is_error

    run_with(sandbox, body)


def test_files_only_in_its_own_scratch_directory(sandbox: SandboxConfig) -> None:
    with host_secret() as secret:
        code = (
            "import os\n"
            "open('/mnt/data/kept.txt', 'w').write('scratch')\n"
            f"for path in ['/usr/evil.txt', '/etc/evil.txt', '/evil.txt', {str(secret)!r}]:\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        print('WROTE', path)\n"
            "    except OSError as exc:\n"
            "        print('refused', path, exc.strerror)\n"
            f"print(os.path.exists({str(secret)!r}), os.path.exists({str(secret.parent)!r}))\n"
            "print(sorted(os.listdir('/')), sorted(os.listdir('/etc')),"
            " sorted(os.listdir('/mnt')))\n"
            "print(os.getcwd(), os.getuid())\n"
        )
        expected_root = sorted(
            {"dev", "etc", "mnt", "proc", "tmp"}
            | {p.strip("/") for p in SYSTEM_DIRS if os.path.lexists(p)}
        )
        expected_etc = sorted(p.rsplit("/", 1)[1] for p in SYSTEM_FILES if os.path.isfile(p))

        async def body(tool: PythonTool) -> None:
            result = await tool.call("python", code, ctx())
            assert "WROTE" not in result.text
            assert result.text.count("refused") == 4
            assert "refused /usr/evil.txt Read-only file system" in result.text
            *_, absent, listed, where = result.text.splitlines()
            assert absent == "False False"  # the host's files are not there at all
            assert listed == f"{expected_root} {expected_etc} {['.saved', 'data']}"
            assert where == "/mnt/data 1000"
            (scratch,) = [k.scratch for k in tool.pool._kernels.values()]
            assert (scratch / "kept.txt").read_text() == "scratch"
            assert scratch.stat().st_mode & 0o077 == 0
            assert secret.read_text() == "host data"

        run_with(sandbox, body)


def test_fork_bomb_is_stopped_and_its_processes_killed(sandbox: SandboxConfig) -> None:
    code = "import os\nn = 0\nwhile True:\n    os.fork()\n    n += 1"

    async def body(tool: PythonTool) -> None:
        await tool.call("python", "kept = 'yes'", ctx())
        started = time.monotonic()
        result = await tool.call("python", code, ctx())
        assert time.monotonic() - started < 20
        assert "BlockingIOError: [Errno 11] Resource temporarily unavailable" in result.text
        # the kernel lives on, with its state, and nothing the bomb forked is left
        after = await tool.call("python", LIVE_PROCESSES + "print(kept, live())", ctx())
        assert after.text == "yes [1, 2]\n"  # bwrap's init and the kernel

    run_with(sandbox, body)


LIVE_PROCESSES = """import os, time
def live():
    time.sleep(0.2)  # a process SIGKILLed a moment ago may not have ended yet
    found = []
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            with open(f'/proc/{pid}/stat') as stat:
                if stat.read().rsplit(')', 1)[1].split()[0] != 'Z':  # zombies have ended
                    found.append(int(pid))
    return sorted(found)
"""


def test_memory_past_the_limit_is_refused(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        result = await tool.call("python", "big = bytearray(512 * 1024 * 1024)", ctx())
        assert "MemoryError" in result.text
        assert (await tool.call("python", "small = bytearray(1024); len(small)", ctx())).text == (
            "1024\n"
        )

    run_with(sandbox, body)


def test_code_that_sleeps_forever_is_interrupted_and_the_state_kept(
    sandbox: SandboxConfig,
) -> None:
    async def body(tool: PythonTool) -> None:
        await tool.call("python", "kept = 7", ctx())
        started = time.monotonic()
        result = await tool.call("python", "import time\ntime.sleep(10_000)", ctx())
        assert 2.5 < time.monotonic() - started < 10
        assert "ExecutionTimeout: the code ran past the tool's time limit" in result.text
        assert 'File "<string>"' not in result.text  # the kernel's handler is not shown
        assert (await tool.call("python", "kept", ctx())).text == "7\n"

    run_with(sandbox, body)


def test_code_that_ignores_the_interruption_is_killed(sandbox: SandboxConfig) -> None:
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass"

    async def body(tool: PythonTool) -> None:
        await tool.call("python", "open('/mnt/data/f', 'w').write('kept'); v = 1", ctx())
        started = time.monotonic()
        result = await tool.call("python", code, ctx())
        assert time.monotonic() - started < 15
        assert result.is_error
        assert "did not stop when interrupted, so the python session was killed" in result.text
        assert "its variables are lost" in result.text
        # a new kernel on the next call, with the conversation's files
        after = await tool.call("python", "print(open('/mnt/data/f').read()); v", ctx())
        assert after.text.startswith("kept\n")
        assert "NameError: name 'v' is not defined" in after.text

    run_with(sandbox, body)


def test_megabytes_of_output_are_cut_with_a_note(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        result = await tool.call("python", "print('a' * 3_000_000)\nprint('done')", ctx())
        assert result.text.startswith("a" * 4000)
        assert len(result.text) < 4400
        assert "characters omitted" in result.text
        assert "more bytes of output were dropped" in result.text
        endless = await tool.call("python", "while True:\n    print('spam' * 1000)", ctx())
        assert "ExecutionTimeout" not in endless.text[:4000]
        assert "more bytes of output were dropped" in endless.text
        assert (await tool.call("python", "1 + 1", ctx())).text == "2\n"

    run_with(sandbox, body)


def test_a_kernel_that_dies_is_reported_and_replaced(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        result = await tool.call("python", "import os, signal\nos.kill(os.getpid(), 9)", ctx())
        assert result.is_error
        assert "the python session was killed" in result.text
        assert (await tool.call("python", "2 + 2", ctx())).text == "4\n"

    run_with(sandbox, body)


def test_the_number_of_kernels_is_capped(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        pool: KernelPool = tool.pool
        await tool.call("python", "a = 1", ctx("c1"))
        await tool.call("python", "a = 2", ctx("c2"))
        scratch = pool._kernels["c1"].scratch
        await tool.call("python", "a = 3", ctx("c3"))  # past the cap: the oldest goes
        assert sorted(pool._kernels) == ["c2", "c3"]
        assert not scratch.exists()

    run_with(sandbox, body, max_kernels=2, idle_s=600)  # no reaping during the test


def test_idle_kernels_are_reaped(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        pool: KernelPool = tool.pool
        await tool.call("python", "a = 2", ctx("c2"))
        deadline = time.monotonic() + 30
        while len(pool) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(pool) == 0  # the reaper closed it
        assert "NameError" in (await tool.call("python", "a", ctx("c2"))).text

    run_with(sandbox, body, max_kernels=2, idle_s=0.5)


def test_busy_kernels_are_not_taken(sandbox: SandboxConfig) -> None:
    async def body(tool: PythonTool) -> None:
        slow = asyncio.create_task(tool.call("python", "import time; time.sleep(1.5)", ctx("c1")))
        await asyncio.sleep(0.5)
        busy = await tool.call("python", "1", ctx("c2"))
        assert busy.is_error
        assert "busy" in busy.text
        assert (await slow).text == NO_OUTPUT

    run_with(sandbox, body, max_kernels=1)


def test_a_missing_bubblewrap_turns_the_tool_off_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
        configure()


def test_an_interpreter_bubblewrap_cannot_reach_is_reported(sandbox: SandboxConfig) -> None:
    with pytest.raises(SandboxUnavailable, match="not found"):
        configure(interpreter="/nonexistent/python3")


AS_A_USER_WITHOUT_CGROUP = """
import asyncio
from server.tools.python.kernels import KernelPool
from server.tools.python.sandbox import SandboxUnavailable, configure
try:
    print("BOUNDED", configure().describe())
except SandboxUnavailable as exc:
    print("REFUSED", exc)
config = configure(without_cgroup=True)
print("CHOSEN", config.describe())
async def main():
    pool = KernelPool(config)
    try:
        print("RAN", (await pool.run("c", "import os\\nprint(os.getuid(), 6 * 7)", 10)).output)
    finally:
        await pool.close()
asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to an ordinary user")
def test_an_ordinary_user_without_a_cgroup_is_told_why_and_may_choose_per_process_limits(
    sandbox: SandboxConfig,
) -> None:
    """As a user who can make no cgroup (cgroup v1, or v2 without a delegated subtree), the
    tool is refused with what to do, and runs with per-process limits only when asked."""
    # the system's python of this version, reachable by any user, with this run's packages
    python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python} for an ordinary user to run")
    repo = Path(__file__).parents[2]
    packages = [p for p in sys.path if p.endswith("site-packages")]
    ran = subprocess.run(
        [python, "-c", AS_A_USER_WITHOUT_CGROUP],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        user=sandbox.uid,
        group=sandbox.uid,
        extra_groups=[],
        cwd=repo,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(repo), *packages])},
    )
    lines = ran.stdout.splitlines()
    assert ran.returncode == 0, ran.stderr[-2000:]
    if lines[0].startswith("BOUNDED"):
        pytest.skip(f"this user has a delegated cgroup: {lines[0]}")
    assert lines[0].startswith("REFUSED no cgroup can be made for the python tool's sandboxes")
    assert "--python-tool-without-cgroup" in lines[0]
    assert "systemd-run --user --scope -p Delegate=yes" in lines[0]
    assert lines[1].startswith("CHOSEN per-process limits only (no cgroup)")
    assert lines[2] == "RAN 1000 42"
