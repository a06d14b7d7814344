"""One cgroup per python kernel: the resource domain that bounds a sandbox's processes together.

A sandbox's memory (its processes' and the pages of its tmpfs mounts: /tmp, /dev/shm,
/mnt/data), its number of processes and its CPU share are limits of its cgroup, not of each
process. `find()` picks what this machine offers:

- cgroup v2 with the memory, pids and cpu controllers in a subtree this process may write (a
  root server, or a user's server started in a delegated scope such as
  `systemd-run --user --scope -p Delegate=yes ...`): the kernels' groups are made beside a leaf
  group the server's own processes are moved into (v2 lets only leaves hold processes).
- cgroup v1 as root: a group in each of the memory, pids, cpu and freezer hierarchies, under the
  server's own group there.

`CgroupUnavailable` says why neither works and what the operator can do. A `Cgroup` is made
before its kernel starts; the sandbox's launcher writes its own pid into `procs_files` before it
executes bubblewrap, so every process of the sandbox is in it from the start. `freeze` stops
everything in it at once (between calls), `kill` ends everything in it and removes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PREFIX = "gpt-oss-python-"
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
SERVER_LEAF = "gpt-oss-server"  # v2: where the server's own processes move in a delegated scope
SETTLE_S = 5.0  # a freeze or a kill has this long to take effect


class CgroupUnavailable(RuntimeError):
    """No cgroup can be had here; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    memory_bytes: int
    processes: int
    cpu_cores: float


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as file:
        file.write(value)


def _pids(procs: Path) -> list[int]:
    with contextlib.suppress(FileNotFoundError):
        return [int(line) for line in procs.read_text().split()]
    return []


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One kernel's group: a directory per hierarchy (v1) or one directory (v2)."""

    version: int
    dirs: dict[str, Path]  # controller (v1) or "" (v2) -> directory

    @property
    def procs_files(self) -> tuple[str, ...]:
        return tuple(str(d / "cgroup.procs") for d in self.dirs.values())

    @property
    def _main(self) -> Path:
        return self.dirs["memory" if self.version == 1 else ""]

    def pids(self) -> list[int]:
        return _pids(self._main / "cgroup.procs")

    def freeze(self) -> None:
        """Stop every process in the group; returns once they are stopped."""
        if self.version == 1:
            state = self.dirs["freezer"] / "freezer.state"
            _write(state, "FROZEN")
            self._settle(lambda: state.read_text().strip() == "FROZEN")
        else:
            _write(self.dirs[""] / "cgroup.freeze", "1")
            events = self.dirs[""] / "cgroup.events"
            self._settle(lambda: "frozen 1" in events.read_text().splitlines())

    def thaw(self) -> None:
        if self.version == 1:
            _write(self.dirs["freezer"] / "freezer.state", "THAWED")
        else:
            _write(self.dirs[""] / "cgroup.freeze", "0")

    def kill(self) -> None:
        """SIGKILL everything in the group (v2: cgroup.kill; v1: frozen first, so that nothing
        forks while it is killed) and wait until it is empty."""
        with contextlib.suppress(FileNotFoundError):
            if self.version == 2 and (self.dirs[""] / "cgroup.kill").exists():
                _write(self.dirs[""] / "cgroup.kill", "1")
            else:
                self.freeze()
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.thaw()
            self._settle(lambda: not self.pids())

    def remove(self) -> None:
        """Kill what is left and remove the group's directories."""
        self.kill()
        for directory in self.dirs.values():
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()

    def _settle(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + SETTLE_S
        while not done():
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, f"cgroup {self._main} did not settle")
            time.sleep(0.005)


@dataclass(frozen=True, slots=True)
class Cgroups:
    """Where kernels' groups are made: `bases` per v1 controller, or the v2 directory."""

    version: int
    bases: dict[str, Path]

    def describe(self) -> str:
        return f"cgroup v{self.version} ({', '.join(str(b) for b in self.bases.values())})"

    def create(self, limits: GroupLimits) -> Cgroup:
        name = PREFIX + secrets.token_hex(8)
        dirs = {key: base / name for key, base in self.bases.items()}
        made: list[Path] = []
        try:
            for directory in dirs.values():
                directory.mkdir(mode=0o755)
                made.append(directory)
            group = Cgroup(self.version, dirs)
            _apply(group, limits)
        except OSError:
            for directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        return group


def _apply(group: Cgroup, limits: GroupLimits) -> None:
    quota = max(int(limits.cpu_cores * CPU_PERIOD_US), 1000)
    if group.version == 1:
        memory = group.dirs["memory"]
        _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        if (memory / "memory.memsw.limit_in_bytes").exists():  # swap counts too
            _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        _write(group.dirs["pids"] / "pids.max", str(limits.processes))
        _write(group.dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(group.dirs["cpu"] / "cpu.cfs_quota_us", str(quota))
    else:
        directory = group.dirs[""]
        _write(directory / "memory.max", str(limits.memory_bytes))
        if (directory / "memory.swap.max").exists():
            _write(directory / "memory.swap.max", "0")
        _write(directory / "pids.max", str(limits.processes))
        _write(directory / "cpu.max", f"{quota} {CPU_PERIOD_US}")


def _own_groups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path."""
    found: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _mounts() -> tuple[dict[str, Path], Path | None]:
    """The v1 hierarchy of each controller, and the v2 mount."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, more = left.split(), right.split()
        if not more:
            continue
        mount = Path(fields[4].replace("\\040", " "))
        if more[0] == "cgroup2" and v2 is None:
            v2 = mount
        elif more[0] == "cgroup":
            for option in more[2].split(","):
                if option in V1_CONTROLLERS:
                    v1.setdefault(option, mount)
    return v1, v2


def _v2(mount: Path, own: str) -> Cgroups:
    base = mount / own.lstrip("/")
    controllers = set((base / "cgroup.controllers").read_text().split())
    missing = [c for c in V2_CONTROLLERS if c not in controllers]
    if missing:
        raise CgroupUnavailable(f"{base} lacks the {', '.join(missing)} controller(s)")
    if not os.access(base / "cgroup.subtree_control", os.W_OK) or not os.access(base, os.W_OK):
        raise CgroupUnavailable(f"{base} is not delegated to this user")
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    if not set(V2_CONTROLLERS) <= enabled:
        # only a group without processes of its own may hand controllers to its children
        leaf = base / SERVER_LEAF
        leaf.mkdir(exist_ok=True)
        for pid in _pids(base / "cgroup.procs"):
            with contextlib.suppress(ProcessLookupError):
                _write(leaf / "cgroup.procs", str(pid))
        _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in V2_CONTROLLERS))
    return Cgroups(2, {"": base})


def _v1(mounts: dict[str, Path], own: dict[str, str]) -> Cgroups:
    if os.geteuid() != 0:
        raise CgroupUnavailable("cgroup v1 groups can be made by root only")
    missing = [c for c in V1_CONTROLLERS if c not in mounts]
    if missing:
        raise CgroupUnavailable(f"no v1 hierarchy for {', '.join(missing)}")
    bases = {c: mounts[c] / own.get(c, "/").lstrip("/") for c in V1_CONTROLLERS}
    return Cgroups(1, bases)


def find() -> Cgroups:
    """The cgroups this process can make kernels' groups in (a test group made and removed);
    CgroupUnavailable with every reason otherwise."""
    if not Path("/proc/self/cgroup").exists():
        raise CgroupUnavailable("this system has no cgroups")
    own = _own_groups()
    v1, v2 = _mounts()
    reasons: list[str] = []
    candidates: list[Callable[[], Cgroups]] = []
    if v2 is not None and "" in own:
        candidates.append(lambda: _v2(v2, own[""]))
    if v1:
        candidates.append(lambda: _v1(v1, own))
    for candidate in candidates:
        try:
            cgroups = candidate()
            cgroups.create(GroupLimits(64 << 20, 8, 0.1)).remove()
            return cgroups
        except (CgroupUnavailable, OSError) as exc:
            reasons.append(str(exc))
    raise CgroupUnavailable("; ".join(reasons) or "no cgroup hierarchy is mounted")
