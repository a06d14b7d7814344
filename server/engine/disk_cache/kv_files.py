"""KV files: the on-disk prompt cache's entries, their format, index, writer thread and budget.

One file per saved token prefix, named `<identity>-<n_tokens>-<prefix hash>.kv`: the identity is
a hash of the model file and of every setting that changes the KV layout, so entries made under
other settings are never even opened; the directory listing is the index (two processes of the
same user may share it). A file holds a magic string, a JSON header (identity, token count,
payload size), the prefix's token ids, llama.cpp's sequence state and an HMAC-SHA256 of all
that under the directory's key (32 random bytes in `entries.key`, mode 0600, created once by
whichever process comes first): KV state nobody with the key wrote is never loaded.

The directory is private (server/private_files.py: 0700, this user's, refused otherwise) and
entries are 0600: they hold conversations. Files are written under a temporary name, fsynced and
renamed, so a reader never sees half an entry. Reads open regular files only, without following
links or blocking (a FIFO under an entry's name cannot stall the reader). A file that fails any
check (not a regular file, MAC, header, tokens, the state's layout) is deleted with a warning
and counts as a miss; the next shorter entry is tried. Least recently used entries (by mtime,
touched on every hit) are deleted while the directory holds more than its budget; only files
named exactly as entries (of any identity) are ever counted or deleted, and only stale temporary
files of this module's own naming.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import logging
import os
import queue
import re
import secrets
import stat
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.engine.base import PromptCacheStats
from server.private_files import FILE_MODE, PrivatePathError, private_dir

log = logging.getLogger(__name__)

State = np.ndarray[Any, np.dtype[np.uint8]]
MAGIC = b"GOSKV002"
SUFFIX = ".kv"
KEY_FILE = "entries.key"
KEY_BYTES = 32
MAC_BYTES = 32  # HMAC-SHA256, the file's last bytes
TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 3600.0  # a temporary file this old belongs to no running write
_ENTRY = r"[0-9a-f]{16}-[0-9]{8,}-[0-9a-f]{32}\.kv"
ENTRY_NAME = re.compile(_ENTRY)  # <identity tag>-<n_tokens>-<prefix hash>.kv
TEMP_NAME = re.compile(rf"\.tmp-[0-9]+-[0-9]+-(?:{_ENTRY}|{re.escape(KEY_FILE)})")
_HEADER_LEN_BYTES = 4
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Entry:
    path: Path
    n_tokens: int
    prefix_hash: str


def token_bytes(tokens: Sequence[int]) -> bytes:
    return array("i", tokens).tobytes()


def prefix_hashes(tokens: Sequence[int], lengths: Sequence[int]) -> dict[int, str]:
    """The hash of `tokens[:n]` for each n in `lengths`, in one pass over the tokens."""
    data = token_bytes(tokens)
    digest = hashlib.blake2b(digest_size=16)
    done = 0
    hashes = {}
    for n in sorted(set(lengths)):
        digest.update(data[4 * done : 4 * n])
        done = n
        hashes[n] = digest.copy().hexdigest()
    return hashes


class CorruptEntry(ValueError):
    """A file that is not a whole, valid entry of this identity."""


class KVFiles:
    """The directory of saved prefixes for one model identity; thread-safe where it says so."""

    def __init__(
        self,
        directory: Path,
        identity: str,
        budget_bytes: int,
        max_pending: int,
        check_state: Callable[[bytearray, int], None] | None = None,
    ) -> None:
        """`check_state(data, offset)` raises if the state at `data[offset:]` cannot load."""
        self.directory = directory
        self.identity = identity
        self._check_state = check_state
        self.tag = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
        self.budget_bytes = budget_bytes
        self.stats = PromptCacheStats()
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)  # notified as the writer makes room
        self._saving = True
        private_dir(directory)
        self._remove_stale_temps()
        self._key = entry_key(directory)
        self._queue: queue.Queue[tuple[list[int], State] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._writer.start()

    def _remove_stale_temps(self) -> None:
        """Temporary files of this naming left by a process killed while writing (not ones being
        written: those are recent)."""
        for name in _names(self.directory):
            temp = self.directory / name
            if TEMP_NAME.fullmatch(name):
                with contextlib.suppress(OSError):
                    if time.time() - temp.lstat().st_mtime > STALE_TEMP_S:
                        temp.unlink()

    # --- index (any thread) ---

    def name(self, n_tokens: int, prefix_hash: str) -> str:
        return f"{self.tag}-{n_tokens:08d}-{prefix_hash}{SUFFIX}"

    def entries(self) -> list[Entry]:
        """This identity's entries, as the directory lists them now."""
        found = []
        for name in _names(self.directory):
            if ENTRY_NAME.fullmatch(name) and name.startswith(f"{self.tag}-"):
                _, n_tokens, prefix_hash = name.removesuffix(SUFFIX).split("-")
                found.append(Entry(self.directory / name, int(n_tokens), prefix_hash))
        return found

    def longest(self, tokens: Sequence[int], above: int, limit: int) -> list[Entry]:
        """Entries whose tokens are a prefix of `tokens` with above < n <= limit, longest first."""
        candidates = [e for e in self.entries() if above < e.n_tokens <= limit]
        if not candidates:
            return []
        hashes = prefix_hashes(tokens, [e.n_tokens for e in candidates])
        matching = [e for e in candidates if hashes[e.n_tokens] == e.prefix_hash]
        return sorted(matching, key=lambda e: e.n_tokens, reverse=True)

    def has(self, tokens: Sequence[int]) -> bool:
        name = self.name(len(tokens), prefix_hashes(tokens, [len(tokens)])[len(tokens)])
        return (self.directory / name).exists()

    # --- reading (engine thread) ---

    def read(self, entry: Entry, tokens: Sequence[int]) -> tuple[bytearray, int] | None:
        """The state of `entry` and where it starts, checked against `tokens`.

        None when it is gone, or bad (then it is deleted with a warning)."""
        try:
            data = _read_regular(entry.path, self.budget_bytes)
            offset = self._check(data, entry, tokens)
        except FileNotFoundError:
            return None  # deleted meanwhile (budget, another process)
        except Exception as exc:  # anything unreadable: gone, so shorter entries are tried
            log.warning("prompt cache: deleting %s: %s", entry.path.name, exc)
            self.stats.corrupt += 1
            entry.path.unlink(missing_ok=True)
            return None
        self.stats.bytes_read += len(data) + MAC_BYTES
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # least recently used goes first
        return data, offset

    def _check(self, data: bytearray, entry: Entry, tokens: Sequence[int]) -> int:
        """Where the state starts in `data`, whose MAC is removed; CorruptEntry if it fails."""
        start = len(MAGIC) + _HEADER_LEN_BYTES
        if len(data) < start + MAC_BYTES or data[: len(MAGIC)] != MAGIC:
            raise CorruptEntry("not a prompt-cache file of this version")
        body = memoryview(data)[: len(data) - MAC_BYTES]
        expected = hmac.digest(self._key, body, "sha256")
        body.release()
        if not hmac.compare_digest(expected, bytes(data[-MAC_BYTES:])):
            raise CorruptEntry("its MAC does not match this directory's key")
        del data[-MAC_BYTES:]
        header_len = int.from_bytes(data[len(MAGIC) : start], "little")
        try:
            header = json.loads(bytes(data[start : start + header_len]))
            n_tokens, size = header["n_tokens"], header["payload_bytes"]
            identity = header["identity"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry(f"unreadable header ({exc})") from exc
        if not (_is_count(n_tokens) and _is_count(size) and isinstance(identity, str)):
            raise CorruptEntry("unreadable header (field types)")
        if identity != self.identity:
            raise CorruptEntry("made by another model or other KV settings")
        if n_tokens != entry.n_tokens:
            raise CorruptEntry("token count differs from its name")
        token_start = start + header_len
        payload_start = token_start + 4 * n_tokens
        if len(data) != payload_start + size:
            raise CorruptEntry(f"truncated ({len(data)} bytes, expected {payload_start + size})")
        if data[token_start:payload_start] != token_bytes(tokens[:n_tokens]):
            raise CorruptEntry("its tokens differ from the prompt's")
        if self._check_state is not None:
            self._check_state(data, payload_start)
        return int(payload_start)

    # --- writing ---

    def submit(self, tokens: list[int], state: State) -> bool:
        """Queue a state for writing (engine thread); False when dropped."""
        with self._lock:
            if not self._saving or not self._room(state.nbytes):
                self.stats.skipped_saves += 1
                return False
            self._pending += state.nbytes
        self._queue.put((tokens, state))
        return True

    def wants(self, n_bytes: int, wait_s: float = 0.0) -> bool:
        """Whether a state of about this size would be accepted (before copying it): now, or
        once the writer has made room, waiting at most `wait_s` for it."""
        with self._written:
            self._written.wait_for(lambda: not self._saving or self._room(n_bytes), wait_s)
            return self._saving and self._room(n_bytes)

    def _room(self, n_bytes: int) -> bool:
        """Room for a state of `n_bytes` among those waiting for the writer (under the lock):
        one larger than the whole allowance (but within the budget) goes alone."""
        if self._pending + n_bytes <= self._max_pending:
            return True
        return self._pending == 0 and n_bytes <= self.budget_bytes

    def close(self) -> None:
        """Finish the queued writes, then stop the writer."""
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            tokens, state = item
            try:
                self._write(tokens, state)
            except Exception:  # the writer must outlive one bad write
                log.exception("prompt cache: a save failed")
            finally:
                with self._written:
                    self._pending -= state.nbytes
                    self._written.notify_all()

    def _write(self, tokens: list[int], state: State) -> None:
        prefix_hash = prefix_hashes(tokens, [len(tokens)])[len(tokens)]
        target = self.directory / self.name(len(tokens), prefix_hash)
        if target.exists():
            return
        header = json.dumps(
            {
                "identity": self.identity,
                "n_tokens": len(tokens),
                "payload_bytes": state.nbytes,
                "created": time.time(),
            }
        ).encode()
        temp = self.directory / f"{TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{target.name}"
        try:
            with os.fdopen(os.open(temp, _CREATE_FLAGS, FILE_MODE), "wb") as f:
                mac = hmac.new(self._key, digestmod="sha256")
                for part in (
                    MAGIC + len(header).to_bytes(_HEADER_LEN_BYTES, "little") + header,
                    token_bytes(tokens),
                    state.data,
                ):
                    mac.update(part)
                    f.write(part)
                f.write(mac.digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
            _fsync_dir(self.directory)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            if exc.errno in _FULL_DISK:
                with self._lock:
                    self._saving = False
                log.warning("prompt cache: the disk is full (%s); no more saves this run", exc)
                return
            raise
        self.stats.saves += 1
        self.stats.bytes_written += target.stat().st_size
        self.enforce_budget()

    def enforce_budget(self) -> None:
        """Delete the least recently used entries (of any identity) beyond the budget.

        Only regular files named as entries count: nothing else in the directory is deleted."""
        files = []
        for name in _names(self.directory):
            if not ENTRY_NAME.fullmatch(name):
                continue
            path = self.directory / name
            try:
                info = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                files.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.budget_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            self.stats.evicted += 1
            log.info("prompt cache: deleted %s (over the budget)", path.name)


def entry_key(directory: Path) -> bytes:
    """The directory's MAC key, made now (atomically: the first process's key wins) if none."""
    path = directory / KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read_key(path)
    temp = directory / f"{TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{KEY_FILE}"
    with os.fdopen(os.open(temp, _CREATE_FLAGS, FILE_MODE), "wb") as f:
        f.write(secrets.token_bytes(KEY_BYTES))
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(temp, path)  # never replaces a key another process made meanwhile
    except FileExistsError:
        pass
    finally:
        temp.unlink(missing_ok=True)
    _fsync_dir(directory)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid not in (os.geteuid(), 0)
            or info.st_mode & 0o077
            or info.st_size != KEY_BYTES
        ):
            raise PrivatePathError(
                f"{path} is not a 0600 file of {KEY_BYTES} bytes of this user: delete it (the "
                "entries made under it are then deleted as they are read)"
            )
        key = os.read(fd, KEY_BYTES)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise PrivatePathError(f"{path} changed while it was read")
    return key


def _read_regular(path: Path, limit: int) -> bytearray:
    """The bytes of a regular file of at most `limit` bytes, never following a link or waiting
    on a FIFO or device."""
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptEntry("not a regular file")
        if info.st_size > limit:  # no entry outlives a save beyond the budget
            raise CorruptEntry(f"larger than the budget ({info.st_size} bytes)")
        data = bytearray(info.st_size)
        view = memoryview(data)
        done = 0
        while done < len(data):
            n = os.readv(fd, [view[done:]])
            if n == 0:
                break
            done += n
        view.release()
    finally:
        os.close(fd)
    if done != len(data):
        raise CorruptEntry("it shrank while it was read")
    return data


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
