"""The python tool's sandbox: Linux bubblewrap, its command line, and whether it works here.

A sandbox is a bubblewrap (`bwrap`) process with every namespace unshared (no network: only a
loopback nobody listens on; its own PIDs, IPC, hostname, user), the system's `/usr` (and the
interpreter's prefix) read-only, a fresh `/tmp` and `/dev`, nothing else of the host's files but
one writable scratch directory, mounted at `/mnt/data` (where harmony's description of the tool
tells the model to keep files). When the server runs as root, bubblewrap itself runs as an
unprivileged user of its own (`SandboxConfig.uid`): the process-count limit does not apply to
root, and a process that escaped its namespaces would still be nobody. The kernel inside sets
its own CPU, memory, file-size, open-file and process limits before it runs any code
(kernel.py). Killing the bwrap process ends everything in the sandbox (`--die-with-parent` on
the PID namespace's init).

`probe()` runs a sandbox once at start-up: where bubblewrap is missing or cannot create its
namespaces (a container without user namespaces, a kernel that forbids them to unprivileged
users), the python tool stays off and `serve` says why.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_SCRIPT = Path(__file__).with_name("kernel.py")
SCRATCH_MOUNT = "/mnt/data"
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
DEFAULT_INTERPRETERS = ("/usr/bin/python3", "/usr/local/bin/python3")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one kernel may use. `cpu_seconds` is for the kernel's whole life (every call of the
    conversation); `timeout_s` is the wall-clock time of one call."""

    timeout_s: float = 60.0
    cpu_seconds: int = 300
    memory_bytes: int = 1 << 30
    processes: int = 32
    file_bytes: int = 64 << 20
    open_files: int = 256
    output_bytes: int = 1 << 20  # read from one call; the rest is counted and dropped
    tmp_bytes: int = 64 << 20  # the size of the sandbox's /tmp (in memory)

    def for_kernel(self) -> dict[str, int]:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_bytes,
            "processes": self.processes,
            "file_bytes": self.file_bytes,
            "open_files": self.open_files,
        }


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How sandboxes are made: the bwrap and python executables (absolute paths), the
    interpreter's own directories to mount read-only, the user a root server runs them as."""

    bwrap: str
    interpreter: str
    interpreter_dirs: tuple[str, ...] = ()
    uid: int | None = None  # run bwrap as this user and group (a root server only)
    limits: Limits = field(default_factory=Limits)

    def command(self, scratch: Path) -> list[str]:
        """The bwrap command line that runs the kernel with `scratch` as /mnt/data."""
        argv = [
            self.bwrap,
            "--unshare-all",
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
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(self.limits.tmp_bytes),
            "--tmpfs",
            "/tmp",
            "--bind",
            str(scratch),
            SCRATCH_MOUNT,
            "--remount-ro",
            "/",  # the root bwrap built, so that only /mnt/data and /tmp take writes
            "--chdir",
            SCRATCH_MOUNT,
            self.interpreter,
            "-I",  # isolated: no user site, no PYTHON* variables, no cwd on sys.path
            "-u",  # unbuffered, so that stdout and stderr keep their order
            "-c",  # the kernel's source itself: the sandbox's user need not reach this file
            kernel_source(),
            json.dumps(self.limits.for_kernel()),
        ]
        return argv

    @property
    def extra_groups(self) -> list[int] | None:
        """subprocess's `extra_groups` with `user=uid, group=uid`: none for the sandbox's user
        (None, unchanged, where the server is not root)."""
        return None if self.uid is None else []

    def prepare_scratch(self, path: Path) -> None:
        """A new private scratch directory the sandbox's user owns."""
        path.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)


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


def configure(
    interpreter: str | None = None, uid: int = 64_000, limits: Limits | None = None
) -> SandboxConfig:
    """The sandbox configuration for this machine, checked by running one; SandboxUnavailable
    (with the reason) where it cannot run."""
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
    config = SandboxConfig(
        bwrap=bwrap,
        interpreter=os.path.abspath(python),
        interpreter_dirs=interpreter_dirs(python),
        uid=uid if _is_root() else None,
        limits=limits or Limits(),
    )
    probe(config)
    return config


def probe(config: SandboxConfig) -> None:
    """Run one sandbox with a kernel that prints a line; SandboxUnavailable if it fails."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpt-oss-sandbox-probe-") as root:
        os.chmod(root, 0o711)
        scratch = Path(root) / "scratch"
        config.prepare_scratch(scratch)
        request = json.dumps({"code": "print(6 * 7)", "marker": "\x1edone\x1e", "timeout": 20})
        try:
            ran = subprocess.run(
                config.command(scratch),
                input=request + "\n",
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                user=config.uid,
                group=config.uid,
                extra_groups=config.extra_groups,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"bubblewrap did not run: {exc}") from exc
        if ran.stdout != "42\n\x1edone\x1e":
            said = (ran.stdout + ran.stderr).strip()[-400:] or f"exit status {ran.returncode}"
            raise SandboxUnavailable(f"bubblewrap could not run a sandbox here: {said}")
