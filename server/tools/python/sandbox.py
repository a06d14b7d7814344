"""The python tool's sandbox: Linux bubblewrap, its command line, and whether it works here.

A sandbox is a bubblewrap (`bwrap`) process with every namespace unshared (no network: only a
loopback nobody listens on; its own PIDs, IPC, hostname, user), the system's `/usr` (and the
interpreter's prefix) read-only, a read-only `/dev`, and nothing else of the host's files.
Writable are three tmpfs mounts of fixed sizes, whose pages its cgroup's memory limit counts
too: `/tmp`, `/dev/shm` and `/mnt/data` (where harmony's description of the tool tells the model
to keep files). `/mnt/data` is copied in at the kernel's start from the conversation's host
directory, bound read-only at `/mnt/.saved`, and copied back out by the server after each call
(files.py), so that a new kernel of the same conversation finds the files.

All of a sandbox's processes share one cgroup (cgroups.py): memory, process count and CPU share
are bounded for the sandbox as a whole. The launcher (`LAUNCHER`, the server's own Python) writes
its pid into the cgroup, drops to the sandbox's user where the server is root, and only then
executes bubblewrap, so nothing of the sandbox ever runs outside the group. Nested user
namespaces are refused (`--disable-userns` where bubblewrap has it, 0.8 and later; the seccomp
filter refuses them anyway), and a seccomp filter (seccomp.py) refuses the system calls a
notebook never needs. The kernel inside also sets per-process CPU-time, memory, file-size,
open-file and process limits before it runs any code (kernel.py). When the server runs as root,
bubblewrap itself runs as an unprivileged user of its own (`SandboxConfig.uid`): a process that
escaped its namespaces would still be nobody.

`probe()` runs a sandbox once at start-up: where bubblewrap is missing or cannot create its
namespaces (a container without user namespaces, a kernel that forbids them to unprivileged
users), where no cgroup can be had (unless the operator chose per-process limits only), or where
the sandbox does not refuse a new user namespace, the python tool stays off and `serve` says why.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from server.tools.python import seccomp
from server.tools.python.cgroups import Cgroup, Cgroups, CgroupUnavailable, GroupLimits, find

KERNEL_SCRIPT = Path(__file__).with_name("kernel.py")
SCRATCH_MOUNT = "/mnt/data"
SAVED_MOUNT = "/mnt/.saved"  # the conversation's files as last saved, read-only
REQUEST_FD = 100  # the kernel reads its requests on this descriptor (kernel.py)
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
DEFAULT_INTERPRETERS = ("/usr/bin/python3", "/usr/local/bin/python3")
DISABLE_USERNS_SINCE = (0, 8)

# The first step of every sandbox: into the cgroup, down to the sandbox's user, then bubblewrap.
# argv: the cgroup.procs files (JSON), the uid ("" to keep), then bubblewrap's command line.
LAUNCHER = """
import json, os, sys
for path in json.loads(sys.argv[1]):
    with open(path, "w") as procs:
        procs.write(str(os.getpid()))
if sys.argv[2]:
    os.setgroups([])
    os.setgid(int(sys.argv[2]))
    os.setuid(int(sys.argv[2]))
os.execv(sys.argv[3], sys.argv[3:])
"""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one kernel may use. `memory_bytes`, `processes` and `cpu_cores` bound the whole
    sandbox (its cgroup); `cpu_seconds` is per process, for the kernel's whole life (every call
    of the conversation); `timeout_s` is the wall-clock time of one call."""

    timeout_s: float = 60.0
    cpu_seconds: int = 300
    memory_bytes: int = 1 << 30
    processes: int = 32
    cpu_cores: float = 1.0
    file_bytes: int = 64 << 20
    open_files: int = 256
    output_bytes: int = 1 << 20  # read from one call; the rest is counted and dropped
    tmp_bytes: int = 64 << 20  # the size of the sandbox's /tmp (in memory)
    shm_bytes: int = 64 << 20  # the size of its /dev/shm (in memory)
    data_bytes: int = 256 << 20  # the size of its /mnt/data (in memory, saved between calls)

    def for_kernel(self) -> dict[str, int]:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_bytes,
            "processes": self.processes,
            "file_bytes": self.file_bytes,
            "open_files": self.open_files,
        }

    def for_group(self) -> GroupLimits:
        return GroupLimits(self.memory_bytes, self.processes, self.cpu_cores)


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How sandboxes are made: the bwrap and python executables (absolute paths), the
    interpreter's own directories to mount read-only, the user a root server runs them as, and
    where their cgroups are made (None: per-process limits only, as the operator chose)."""

    bwrap: str
    interpreter: str
    interpreter_dirs: tuple[str, ...] = ()
    uid: int | None = None  # run bwrap as this user and group (a root server only)
    limits: Limits = field(default_factory=Limits)
    cgroups: Cgroups | None = None
    disable_userns: bool = True  # bubblewrap 0.8+: --disable-userns

    def command(self, saved: Path, seccomp_fd: int, cgroup: Cgroup | None) -> list[str]:
        """The launcher's command line that runs the kernel in `cgroup`, with `saved` (the
        conversation's files) copied into /mnt/data and the seccomp program at `seccomp_fd`."""
        procs = list(cgroup.procs_files) if cgroup is not None else []
        launcher = [sys.executable, "-I", "-c", LAUNCHER, json.dumps(procs)]
        launcher.append("" if self.uid is None else str(self.uid))
        return launcher + self.bwrap_command(saved, seccomp_fd)

    def bwrap_command(self, saved: Path, seccomp_fd: int) -> list[str]:
        limits = self.limits
        argv = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            *(["--disable-userns"] if self.disable_userns else []),
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--clearenv",
            "--setenv",
            "HOME",
            SCRATCH_MOUNT,
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "PYTHONUNBUFFERED",
            "1",
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            "--setenv",
            "MPLBACKEND",
            "Agg",
        ]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for path in SYSTEM_FILES:
            if os.path.isfile(path):
                argv += ["--ro-bind", path, path]
        for path in self.interpreter_dirs:
            argv += ["--ro-bind", path, path]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for size, path in (
            (limits.shm_bytes, "/dev/shm"),
            (limits.tmp_bytes, "/tmp"),
            (limits.data_bytes, SCRATCH_MOUNT),
        ):
            argv += ["--size", str(size), "--tmpfs", path]
        argv += [
            "--ro-bind",
            str(saved),
            SAVED_MOUNT,
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",  # the root bwrap built: only the three tmpfs mounts take writes
            "--seccomp",
            str(seccomp_fd),
            "--chdir",
            SCRATCH_MOUNT,
            self.interpreter,
            "-I",  # isolated: no user site, no PYTHON* variables, no cwd on sys.path
            "-u",  # unbuffered, so that stdout and stderr keep their order
            "-c",  # the kernel's source itself: the sandbox's user need not reach this file
            kernel_source(),
            json.dumps(
                {
                    **limits.for_kernel(),
                    "request_fd": REQUEST_FD,
                    "saved": SAVED_MOUNT,
                    "data": SCRATCH_MOUNT,
                }
            ),
        ]
        return argv

    def prepare_scratch(self, path: Path) -> None:
        """A new private directory for the conversation's saved files, the sandbox's user's."""
        path.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)

    def describe(self) -> str:
        """What bounds its sandboxes, for the start-up log."""
        limits = self.limits
        if self.cgroups is None:
            bound = "per-process limits only (no cgroup)"
        else:
            bound = (
                f"{limits.memory_bytes >> 20} MiB, {limits.cpu_cores:g} core(s), "
                f"{limits.processes} processes a sandbox ({self.cgroups.describe()})"
            )
        userns = "" if self.disable_userns else "; bubblewrap < 0.8: user namespaces by seccomp"
        return f"{bound}, /mnt/data {limits.data_bytes >> 20} MiB{userns}"


@functools.cache
def kernel_source() -> str:
    return KERNEL_SCRIPT.read_text(encoding="utf-8")


class SandboxUnavailable(RuntimeError):
    """Sandboxes cannot run here; the message says why and what to do."""


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def interpreter_dirs(interpreter: str) -> tuple[str, ...]:
    """The directories outside the system ones that `interpreter` needs (a pyenv or a venv)."""
    real = os.path.realpath(interpreter)
    found = subprocess.run(
        [real, "-I", "-c", "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix]))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if found.returncode != 0:
        raise SandboxUnavailable(f"{interpreter} does not run: {found.stderr.strip()[-300:]}")
    prefixes = [*json.loads(found.stdout), os.path.dirname(real)]
    system = tuple(path + "/" for path in SYSTEM_DIRS)
    dirs = sorted({p for p in prefixes if not (p + "/").startswith(system) and p != "/"})
    return tuple(d for d in dirs if not any(d.startswith(o + "/") for o in dirs if o != d))


def default_interpreter() -> str:
    """The system's python3 (its /usr is mounted anyway), else the server's own interpreter."""
    for path in DEFAULT_INTERPRETERS:
        if os.access(path, os.X_OK):
            return path
    return sys.executable


def bwrap_version(bwrap: str) -> tuple[int, ...]:
    said = subprocess.run(
        [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", said)
    return tuple(int(part) for part in found.groups() if part) if found else (0,)


NO_CGROUP_HELP = (
    "run the server as root (cgroup v1 or v2), or as a user in a delegated cgroup v2 scope "
    "(`systemd-run --user --scope -p Delegate=yes gpt-oss-server serve ...`), or pass "
    "--python-tool-without-cgroup to run the tool with per-process limits only"
)


def configure(
    interpreter: str | None = None,
    uid: int = 64_000,
    limits: Limits | None = None,
    *,
    without_cgroup: bool = False,
) -> SandboxConfig:
    """The sandbox configuration for this machine, checked by running one; SandboxUnavailable
    (with the reason) where it cannot run. `without_cgroup`: where no cgroup can be had, run
    with per-process limits only instead of not at all."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"the python tool's sandbox needs Linux (this is {sys.platform})")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        )
    chosen = interpreter or default_interpreter()
    python = shutil.which(chosen)
    if python is None:
        raise SandboxUnavailable(f"the sandbox's interpreter {chosen} was not found")
    try:
        seccomp.program()
    except seccomp.SeccompUnavailable as exc:
        raise SandboxUnavailable(f"no seccomp filter: {exc}") from exc
    cgroups: Cgroups | None = None
    try:
        cgroups = find()
    except CgroupUnavailable as exc:
        if not without_cgroup:
            raise SandboxUnavailable(
                f"no cgroup can be made for the python tool's sandboxes ({exc}): " + NO_CGROUP_HELP
            ) from exc
    config = SandboxConfig(
        bwrap=bwrap,
        interpreter=os.path.abspath(python),
        interpreter_dirs=interpreter_dirs(python),
        uid=uid if _is_root() else None,
        limits=limits or Limits(),
        cgroups=cgroups,
        disable_userns=bwrap_version(bwrap) >= DISABLE_USERNS_SINCE,
    )
    probe(config)
    return config


PROBE_CODE = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "print(6 * 7, libc.unshare(0x10000000), ctypes.get_errno())"  # CLONE_NEWUSER: EPERM
)


def probe(config: SandboxConfig) -> None:
    """Run one sandbox, in its cgroup, with a kernel that prints a line and tries to make a user
    namespace; SandboxUnavailable if it fails or the namespace is made."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpt-oss-sandbox-probe-") as root:
        os.chmod(root, 0o711)
        saved = Path(root) / "saved"
        config.prepare_scratch(saved)
        request = json.dumps({"code": PROBE_CODE, "marker": "\x1edone\x1e", "timeout": 20})
        cgroup = config.cgroups.create(config.limits.for_group()) if config.cgroups else None
        seccomp_fd = seccomp.program_fd()
        try:
            ran = subprocess.run(
                config.command(saved, seccomp_fd, cgroup),
                input=request + "\n",
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                pass_fds=(seccomp_fd,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"bubblewrap did not run: {exc}") from exc
        finally:
            os.close(seccomp_fd)
            if cgroup is not None:
                cgroup.remove()
        if ran.stdout == "42 -1 1\n\x1edone\x1e":
            return
        said = (ran.stdout + ran.stderr).strip()[-400:] or f"exit status {ran.returncode}"
        if ran.stdout.startswith("42 "):
            raise SandboxUnavailable(f"the sandbox did not refuse a new user namespace: {said}")
        raise SandboxUnavailable(f"bubblewrap could not run a sandbox here: {said}")
