"""Private files: directories only this user may change, files only this user may read.

What the server keeps on disk holds whole conversations (the responses store, the prompt cache)
or a secret (the thinking-signature key). `private_dir` creates a directory 0700, or accepts an
existing one only if this user owns it and neither group nor others may write to it, and every
directory above it is this user's or root's and not writable by others unless sticky (as ssh's
StrictModes checks ~/.ssh and its parents): another user who could write there could swap the
files under the server.
`private_file` and `open_private` check a file likewise and create new ones 0600, atomically
(never a moment with the umask's mode). A leaf: it imports nothing of the server.

POSIX only in its checks: where the platform has no owners and modes (Windows), the paths are
created and accepted as they are.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

DIR_MODE = 0o700
FILE_MODE = 0o600
_CHECKS = os.name == "posix"


class PrivatePathError(Exception):
    """A path the server would keep private data in is not private; the message says how to fix
    it."""


def private_dir(path: Path | str) -> Path:
    """`path` as a private directory: created 0700 (with its missing parents) or checked.

    Raises PrivatePathError when it exists but is not a directory, belongs to another user, or
    group or others may write to it.
    """
    directory = Path(path).expanduser()
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass  # made by someone else meanwhile: checked below like any existing one
        else:
            os.chmod(directory, DIR_MODE)  # mkdir's mode is masked by the umask
    info = directory.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise PrivatePathError(f"{directory} is not a directory")
    _check(directory, info, "directory", "chmod go-w")
    _check_parents(directory)
    return directory


def _check_parents(directory: Path) -> None:
    """Every directory above `directory` (as written and with its links resolved), up to the
    root, as ssh's StrictModes checks them: owned by this user or root, and nobody else may
    change what it holds — unless it is sticky (as /tmp): there nobody else may rename or
    delete this user's entries. Otherwise another user could swap `directory` for one of
    theirs."""
    if not _CHECKS:
        return
    absolute = Path(os.path.abspath(directory))
    parents = dict.fromkeys([*absolute.parents, *directory.resolve().parents])
    for parent in parents:
        info = parent.stat()
        if info.st_uid not in (0, os.geteuid()):
            raise PrivatePathError(
                f"directory {parent}, above {directory}, belongs to another user (uid "
                f"{info.st_uid}), who could swap what it holds: choose another path"
            )
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            mode = stat.S_IMODE(info.st_mode)
            raise PrivatePathError(
                f"directory {parent}, above {directory}, has mode {mode:04o}: others than its "
                f"owner could swap what it holds; `chmod go-w {parent}` (or `chmod +t`) or "
                "choose another path"
            )


def private_file(path: Path | str, *, tighten: bool = False) -> Path:
    """`path` as a private file: created empty 0600 if missing (its directory must exist), else
    checked: a regular file of this user that neither group nor others may read or write.

    `tighten`: an existing file of this user's that others may read is made 0600 instead of
    refused (files an earlier version created with the umask's mode).
    """
    with open_private(path, "ab", tighten=tighten):
        pass
    return Path(path)


def open_private(path: Path | str, mode: str = "rb", *, tighten: bool = False) -> IO[bytes]:
    """Open a file of this user's only: a new one is created 0600 in one step, an existing one
    is checked first (PrivatePathError; `tighten` as in private_file) and never followed as a
    symbolic link.

    `mode`: "rb", "wb" (truncates), "ab", "xb" (must not exist), "r+b".
    """
    flags = {
        "rb": os.O_RDONLY,
        "r+b": os.O_RDWR,
        "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    }[mode]
    file = Path(path).expanduser()
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(file, flags, FILE_MODE)
    except OSError as exc:
        if file.is_symlink():
            message = f"{file} is a symbolic link; the server opens no link there"
            raise PrivatePathError(message) from exc
        raise
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise PrivatePathError(f"{file} is not a regular file")
        if tighten and _CHECKS and info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.fchmod(descriptor, FILE_MODE)
        else:
            _check(file, info, "file", "chmod 600", forbidden=0o077)
        return os.fdopen(descriptor, mode.replace("x", "w"))
    except BaseException:
        os.close(descriptor)
        raise


def _check(path: Path, info: os.stat_result, kind: str, fix: str, forbidden: int = 0o022) -> None:
    if not _CHECKS:
        return
    if info.st_uid != os.geteuid():
        raise PrivatePathError(
            f"{kind} {path} belongs to another user (uid {info.st_uid}); the server keeps "
            "private data there only in its own: choose another path or change its owner"
        )
    if info.st_mode & forbidden:
        mode = stat.S_IMODE(info.st_mode)
        raise PrivatePathError(
            f"{kind} {path} has mode {mode:04o}: others than its owner may "
            f"{'change' if forbidden == 0o022 else 'read or change'} it; `{fix} {path}` "
            "or choose another path"
        )
