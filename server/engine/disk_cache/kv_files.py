"""KV files: the on-disk prompt cache's entries, their format, index, writer thread and budget.

One file per saved token prefix, named `<identity>-<n_tokens>-<prefix hash>.kv`: the identity is
a hash of the model file and of every setting that changes the KV layout, so entries made under
other settings are never even opened; the directory listing is the index (two processes may
share it). A file holds a magic string, a JSON header (identity, token count, payload size and
CRC-32), the prefix's token ids and llama.cpp's sequence state. Files are written under a
temporary name, fsynced and renamed, so a reader never sees half an entry. A file that fails its
checks is deleted with a warning and counts as a miss. Least recently used entries (by mtime,
touched on every hit) are deleted while the directory holds more than its budget.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import queue
import threading
import time
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.engine.base import PromptCacheStats

log = logging.getLogger(__name__)

State = np.ndarray[Any, np.dtype[np.uint8]]
MAGIC = b"GOSKV001"
SUFFIX = ".kv"
TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 3600.0  # a temporary file this old belongs to no running write
_HEADER_LEN_BYTES = 4
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


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

    def __init__(self, directory: Path, identity: str, budget_bytes: int, max_pending: int) -> None:
        self.directory = directory
        self.identity = identity
        self.tag = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
        self.budget_bytes = budget_bytes
        self.stats = PromptCacheStats()
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._saving = True
        directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        self._queue: queue.Queue[tuple[list[int], State] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._writer.start()

    def _remove_stale_temps(self) -> None:
        """Temporary files left by a process killed while writing (not ones being written)."""
        for temp in self.directory.glob(f"{TEMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if time.time() - temp.stat().st_mtime > STALE_TEMP_S:
                    temp.unlink()

    # --- index (any thread) ---

    def name(self, n_tokens: int, prefix_hash: str) -> str:
        return f"{self.tag}-{n_tokens:08d}-{prefix_hash}{SUFFIX}"

    def entries(self) -> list[Entry]:
        """This identity's entries, as the directory lists them now."""
        found = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            parts = name[: -len(SUFFIX)].split("-") if name.endswith(SUFFIX) else []
            if len(parts) == 3 and parts[0] == self.tag and parts[1].isdigit():
                found.append(Entry(self.directory / name, int(parts[1]), parts[2]))
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
        """The file of `entry` and where its state starts, checked against `tokens`.

        None when it is gone, or bad (then it is deleted with a warning)."""
        try:
            with entry.path.open("rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(data)
            offset = self._check(data, entry, tokens)
        except FileNotFoundError:
            return None  # deleted meanwhile (budget, another process)
        except (OSError, CorruptEntry) as exc:
            log.warning("prompt cache: deleting %s: %s", entry.path.name, exc)
            self.stats.corrupt += 1
            entry.path.unlink(missing_ok=True)
            return None
        self.stats.bytes_read += len(data)
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # least recently used goes first
        return data, offset

    def _check(self, data: bytearray, entry: Entry, tokens: Sequence[int]) -> int:
        if data[: len(MAGIC)] != MAGIC:
            raise CorruptEntry("not a prompt-cache file")
        start = len(MAGIC) + _HEADER_LEN_BYTES
        header_len = int.from_bytes(data[len(MAGIC) : start], "little")
        try:
            header = json.loads(bytes(data[start : start + header_len]))
            n_tokens, size, crc = header["n_tokens"], header["payload_bytes"], header["crc32"]
            identity = header["identity"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry(f"unreadable header ({exc})") from exc
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
        if zlib.crc32(memoryview(data)[payload_start:]) != int(crc):
            raise CorruptEntry("checksum mismatch")
        return int(payload_start)

    # --- writing ---

    def submit(self, tokens: list[int], state: State) -> bool:
        """Queue a state for writing (engine thread); False when dropped."""
        with self._lock:
            if not self._saving or self._pending + state.nbytes > self._max_pending:
                self.stats.skipped_saves += 1
                return False
            self._pending += state.nbytes
        self._queue.put((tokens, state))
        return True

    def wants(self, n_bytes: int) -> bool:
        """Whether a state of about this size would be accepted now (before copying it)."""
        with self._lock:
            return self._saving and self._pending + n_bytes <= self._max_pending

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
                with self._lock:
                    self._pending -= state.nbytes

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
                "crc32": zlib.crc32(state.data),
                "created": time.time(),
            }
        ).encode()
        temp = self.directory / f"{TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{target.name}"
        try:
            with temp.open("wb") as f:
                f.write(MAGIC + len(header).to_bytes(_HEADER_LEN_BYTES, "little") + header)
                f.write(token_bytes(tokens))
                f.write(state.data)
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
        """Delete the least recently used entries (of any identity) beyond the budget."""
        files = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.budget_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            self.stats.evicted += 1
            log.info("prompt cache: deleted %s (over the budget)", path.name)


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
