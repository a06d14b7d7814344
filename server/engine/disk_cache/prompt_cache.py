"""Prompt cache on disk: save sequences' KV state to files and restore it into a sequence.

Runs on the engine thread, beside the scheduler: `save()` copies a sequence's state out of
llama.cpp (it must be copied there) and hands it to the writer thread of KVFiles (checksum,
write, fsync, rename happen there); `lookup()` finds the longest saved prefix of a prompt and
reads it on a reader thread, and `load()` restores it into a sequence. Entries are keyed by the
model file's identity and the layout of the context's states, as llama.cpp resolved it (see
`identity()`), so entries made under other settings never load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import llama_cpp
import numpy as np

from server.engine.base import EngineConfig, PromptCacheStats
from server.engine.disk_cache.kv_files import CorruptEntry, Entry, KVFiles
from server.engine.disk_cache.state_layout import StateLayout, read_layout

log = logging.getLogger(__name__)

HEADER_HASH_BYTES = 1 << 20  # the model file's first MiB: GGUF header and metadata
KV_TYPE = "f16"  # the context's type_k / type_v (llama.cpp's default; not configurable here)
MAX_PENDING_BYTES = 2 * 1024**3  # memory held by states waiting for the writer


class SequenceStates(Protocol):
    """The sequences' KV state of a llama.cpp context, copied out and back (a LlamaContext)."""

    @property
    def n_ctx(self) -> int: ...

    def seq_state_size(self, seq_id: int) -> int: ...

    def seq_state(self, seq_id: int) -> np.ndarray[Any, np.dtype[np.uint8]]: ...

    def load_seq_state(self, seq_id: int, data: bytearray, offset: int) -> bool: ...

    def probe_state(self) -> np.ndarray[Any, np.dtype[np.uint8]]: ...


def identity(config: EngineConfig, n_ctx: int, layout: StateLayout) -> str:
    """What a saved state's format depends on: the model file (its layers and heads), the
    llama.cpp that wrote it, and the KV cache's layout — the context (a state fits a cache of
    its cell count), the sliding window's cache size, the K and V types, and the layout read
    from the context's own states: the cache streams and whether V is stored transposed (as
    llama.cpp resolved flash attention, which `auto` decides from the devices).

    Not the placement (GPU layers, tensors kept on the CPU): llama.cpp writes a sequence's
    state row by row from whichever device holds it, and a reload after an idle unload may
    place the model differently by the memory free then.
    """
    path = Path(config.model_path)
    stat = path.stat()
    with path.open("rb") as f:
        header_hash = hashlib.blake2b(f.read(HEADER_HASH_BYTES), digest_size=16).hexdigest()
    return json.dumps(
        {
            "model": {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "header": header_hash},
            "llama_cpp": llama_cpp.__version__,
            "n_ctx_seq": n_ctx,
            "swa_full": config.swa_full,
            "type_k": KV_TYPE,
            "type_v": KV_TYPE,
            "state_format": layout.magic,
            "n_stream": layout.n_stream,
            "v_trans": layout.v_trans,
        },
        sort_keys=True,
    )


@dataclass(frozen=True, slots=True)
class Found:
    entry: Entry
    data: bytearray
    offset: int

    @property
    def n_tokens(self) -> int:
        return self.entry.n_tokens


class PromptCache:
    """Saves and restores the sequences of one context; engine thread only (but `stats`)."""

    def __init__(self, ctx: SequenceStates, config: EngineConfig) -> None:
        assert config.prompt_cache_dir is not None
        self._ctx = ctx
        self.min_tokens = max(1, config.prompt_cache_min_tokens)
        budget = config.prompt_cache_bytes
        directory = Path(os.path.expanduser(config.prompt_cache_dir))
        pending = min(budget, MAX_PENDING_BYTES)  # states copied, not written yet
        self.layout = read_layout(ctx.probe_state())
        key = identity(config, ctx.n_ctx, self.layout)
        self.files = KVFiles(directory, key, budget, pending, self._check_layout)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="kv-reader")
        # reads by their candidates, while a job still holds them: one read per entry
        self._reads: weakref.WeakValueDictionary[tuple[Path, ...], Future[Found | None]] = (
            weakref.WeakValueDictionary()
        )
        log.info(
            "prompt cache: %s (budget %.1f GiB, prefixes of %d+ tokens)",
            directory,
            budget / 1024**3,
            self.min_tokens,
        )

    @property
    def stats(self) -> PromptCacheStats:
        return self.files.stats

    def save(self, seq_id: int, tokens: Sequence[int], wait_s: float = 0.0) -> bool:
        """Save the state of a sequence holding exactly `tokens`; False when skipped. With
        `wait_s` (the last saves, at shutdown or unload), it waits that long at most for the
        writer to make room, and says so in the log if it did not."""
        if len(tokens) < self.min_tokens or self.files.has(tokens):
            return False
        started = time.perf_counter()
        size = self._ctx.seq_state_size(seq_id)
        if not self.files.wants(size, wait_s):
            self.stats.skipped_saves += 1
            if wait_s > 0:
                log.warning(
                    "prompt cache: a conversation of %d tokens (%.0f MiB) not saved: the disk "
                    "writes still waiting did not finish within %g s",
                    len(tokens),
                    size / 1024**2,
                    wait_s,
                )
            return False
        state = self._ctx.seq_state(seq_id)
        self.stats.copy_seconds += time.perf_counter() - started
        return self.files.submit(list(tokens), state)

    def lookup(self, prompt: Sequence[int], cached: int) -> Future[Found | None] | None:
        """Start reading the longest saved prefix of `prompt` longer than `cached` tokens.

        The file is read and checked on the reader thread (running streams go on meanwhile);
        None when the disk has no such prefix (a miss). Looked up only when at least
        min_tokens would be evaluated otherwise; at least one prompt token is left to evaluate.
        Prompts with the same candidates share one read (and the state it holds in memory) as
        long as a caller holds its future.
        """
        if len(prompt) - 1 - cached < self.min_tokens:
            return None  # little to gain: not counted
        candidates = self.files.longest(prompt, cached, len(prompt) - 1)
        if not candidates:
            self.stats.misses += 1
            return None
        key = tuple(entry.path for entry in candidates)
        future = self._reads.get(key)
        if future is None or (future.done() and future.exception() is not None):
            future = self._reader.submit(self._read_first, candidates, list(prompt))
            self._reads[key] = future
        return future

    def _read_first(self, candidates: list[Entry], prompt: list[int]) -> Found | None:
        for entry in candidates:
            read = self.files.read(entry, prompt)
            if read is not None:
                return Found(entry, *read)
        return None

    def _check_layout(self, data: bytearray, offset: int) -> None:
        """A state of another layout (under this identity only if written by another llama.cpp
        build, or before the layout was part of it) is a bad file: llama.cpp would refuse it."""
        layout = read_layout(data, offset)
        if layout != self.layout:
            raise CorruptEntry(f"its KV layout {layout} is not this context's {self.layout}")

    def load(self, seq_id: int, found: Found) -> bool:
        """Restore `found` into a sequence (emptied first); False when llama.cpp refuses it:
        for lack of room, its layout being checked when it was read."""
        started = time.perf_counter()
        ok = self._ctx.load_seq_state(seq_id, found.data, found.offset)
        self.stats.load_seconds += time.perf_counter() - started
        if ok:
            self.stats.hits += 1
        return ok

    def close(self) -> None:
        self._reader.shutdown(wait=True)
        self.files.close()
