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
    (a root server's sandbox user) so that the next sandbox can read them. The source is walked
    by directory descriptors, each name opened without following links, so that no change in
    it can lead the copy out of the sandbox."""
    fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _sync(fd, str(dest), uid, _Budget())
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _sync(source: int, dest: str, uid: int | None, budget: _Budget) -> None:
    names = os.listdir(source)
    for name in set(os.listdir(dest)) - set(names):
        _remove(os.path.join(dest, name))
    for name in names:
        dst = os.path.join(dest, name)
        if budget.left <= 0:
            _remove(dst)
            continue
        budget.left -= 1
        try:
            _sync_entry(source, name, dst, uid, budget)
        except FileNotFoundError:
            _remove(dst)  # gone meanwhile


def _sync_entry(source: int, name: str, dst: str, uid: int | None, budget: _Budget) -> None:
    info = os.stat(name, dir_fd=source, follow_symlinks=False)
    try:
        have: os.stat_result | None = os.lstat(dst)
    except FileNotFoundError:
        have = None
    if stat.S_ISDIR(info.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=source)
        try:
            if have is None or not stat.S_ISDIR(have.st_mode):
                _remove(dst)
                os.mkdir(dst, 0o700)
            _own(dst, info.st_mode | 0o700, uid)
            _sync(fd, dst, uid, budget)
        finally:
            os.close(fd)
    elif stat.S_ISLNK(info.st_mode):
        target = os.readlink(name, dir_fd=source)
        _remove(dst)
        os.symlink(target, dst)
        if uid is not None:
            os.lchown(dst, uid, uid)
    elif stat.S_ISREG(info.st_mode):
        unchanged = (info.st_size, info.st_mtime_ns)
        if (
            have is not None
            and stat.S_ISREG(have.st_mode)
            and ((have.st_size, have.st_mtime_ns) == unchanged)
        ):
            return
        _remove(dst)
        _copy_file(source, name, dst)
        _own(dst, info.st_mode, uid)
    else:
        _remove(dst)  # devices, pipes, sockets: not files to keep


def _copy_file(source: int, name: str, dst: str) -> None:
    reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=source)
    with open(reader, "rb") as read:
        info = os.fstat(reader)
        if not stat.S_ISREG(info.st_mode):
            return  # replaced meanwhile by something else
        writer = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(writer, "wb") as write:
            shutil.copyfileobj(read, write, 1 << 20)
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def _own(path: str, mode: int, uid: int | None) -> None:
    os.chmod(path, (stat.S_IMODE(mode) | 0o600) & 0o777)  # one this module made: no link
    if uid is not None:
        os.lchown(path, uid, uid)
