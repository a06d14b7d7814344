"""Private directories: a directory only this user can write, created 0700 or checked as ssh does.

A directory that holds what the server's users said (prompts, KV state of conversations) must not
be one another user can write into (plant files, swap them for links) or owns. `private_dir()`
creates a missing directory with mode 0700 (parents with the umask, as usual) and refuses, with a
message naming the fix, an existing one that is not a directory, that another user owns, or that
group or others can write. No llama.cpp, no settings: the start-up checks and the engine both
use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class UnsafeDirectory(Exception):
    """A directory the server will not keep private data in; the message says why and the fix."""


def private_dir(path: Path) -> Path:
    """`path`, created 0700 if missing; UnsafeDirectory if it is not this user's own."""
    path = Path(os.path.expanduser(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, PRIVATE_DIR_MODE)  # the mode is masked by the umask: at most 0700
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafeDirectory(f"cannot create {path}: {exc.strerror or exc}") from exc
    check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    """UnsafeDirectory unless `path` is a directory (not a link) owned by this user (or root)
    that neither group nor others can write."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafeDirectory(f"cannot use {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory (a link or a file is not accepted)")
    if info.st_uid not in (os.geteuid(), 0):
        raise UnsafeDirectory(
            f"{path} belongs to another user (uid {info.st_uid}); use a directory of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(
            f"{path} can be written by other users (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"run `chmod go-w {path}` (or 700) or use another directory"
        )
