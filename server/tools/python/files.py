"""The conversation's /mnt/data saved out of a stopped sandbox, so that a new kernel finds it.

The sandbox's /mnt/data is a tmpfs of fixed size (sandbox.py); after each call, with every
process of the sandbox stopped (kernels.py), `save` makes the host directory a copy of it, read
through `/proc/PID/root` of a process inside. What it copies is the sandbox's own, so nothing is
followed: a symbolic link is copied as a link (never read through: its target would be the
host's file), directories are entered only when they are directories, files other than regular
files, directories and links are left out, and at most `MAX_ENTRIES` entries are copied. A file
whose size and modification time are unchanged is not copied again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

MAX_ENTRIES = 10_000


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_ENTRIES


def save(source: Path, dest: Path, uid: int | None) -> None:
    """Make `dest` a copy of `source` (a stopped sandbox's /mnt/data); `uid` owns the copies
    (a root server's sandbox user) so that the next sandbox can read them."""
    _sync(str(source), str(dest), uid, _Budget())


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _sync(source: str, dest: str, uid: int | None, budget: _Budget) -> None:
    entries = {entry.name: entry for entry in os.scandir(source)}
    for name in os.listdir(dest):
        if name not in entries:
            _remove(os.path.join(dest, name))
    for name, entry in entries.items():
        if budget.left <= 0:
            _remove(os.path.join(dest, name))
            continue
        budget.left -= 1
        src, dst = entry.path, os.path.join(dest, name)
        info = os.lstat(src)
        try:
            have: os.stat_result | None = os.lstat(dst)
        except FileNotFoundError:
            have = None
        if stat.S_ISDIR(info.st_mode):
            if have is None or not stat.S_ISDIR(have.st_mode):
                _remove(dst)
                os.mkdir(dst, 0o700)
            _own(dst, info.st_mode | 0o700, uid)
            _sync(src, dst, uid, budget)
        elif stat.S_ISLNK(info.st_mode):
            _remove(dst)
            os.symlink(os.readlink(src), dst)
            if uid is not None:
                os.lchown(dst, uid, uid)
        elif stat.S_ISREG(info.st_mode):
            if (
                have is not None
                and stat.S_ISREG(have.st_mode)
                and (have.st_size, have.st_mtime_ns) == (info.st_size, info.st_mtime_ns)
            ):
                continue
            _remove(dst)
            _copy_file(src, dst, info)
            _own(dst, info.st_mode, uid)
        else:
            _remove(dst)  # devices, pipes, sockets: not files to keep


def _copy_file(src: str, dst: str, info: os.stat_result) -> None:
    reader = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(reader, "rb") as read:
        writer = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(writer, "wb") as write:
            shutil.copyfileobj(read, write, 1 << 20)
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def _own(path: str, mode: int, uid: int | None) -> None:
    os.chmod(path, (stat.S_IMODE(mode) | 0o600) & 0o777, follow_symlinks=False)
    if uid is not None:
        os.lchown(path, uid, uid)
