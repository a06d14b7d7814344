"""The layout of llama.cpp's sequence states: what a saved state must match to be restored.

llama.cpp writes a sequence's state as a format magic word and the sequence's id, the number of
cache streams, then per stream its cell count, each cell's position and sequence ids, and the
cells' data — which starts with whether V is stored transposed (so without flash attention, as
llama.cpp resolved it for the context: `--flash-attn auto` decides it from the devices). A state
restores only into a context of the same layout; llama.cpp refuses any other (`load_seq_state`
returns False, exactly as when the cache has no room).

`read_layout` reads that layout from a state: from a probe state of the running context (the
prompt cache's identity, so entries of the other layout are never opened) and from each entry
read from disk (so an entry of another layout is dropped as a bad file, never taken for a lack
of room).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_WORD = 4
MAGIC_BYTES = _WORD  # the format's magic word; the sequence's id follows it


class UnknownStateFormat(ValueError):
    """A state this module cannot read (another llama.cpp state format)."""


@dataclass(frozen=True, slots=True)
class StateLayout:
    magic: str  # the format's magic word, hex
    n_stream: int  # cache streams: 1 with one unified cache, one per sequence otherwise
    v_trans: bool  # V stored transposed (no flash attention)


State = bytes | bytearray | memoryview | np.ndarray[Any, np.dtype[np.uint8]]


def read_layout(data: State, offset: int = 0) -> StateLayout:
    """The layout of the state in `data[offset:]`; UnknownStateFormat if it is not one."""
    view = memoryview(data.data if isinstance(data, np.ndarray) else data)[offset:]
    words = _Words(view)
    magic = bytes(view[:MAGIC_BYTES]).hex()
    words.skip(MAGIC_BYTES + _WORD)
    n_stream = words.next()
    for _ in range(n_stream):
        cell_count = words.next()
        if cell_count == 0:
            continue
        words.skip_cells(cell_count)
        v_trans = words.next()
        if v_trans not in (0, 1):
            raise UnknownStateFormat(f"V transposition flag {v_trans}")
        return StateLayout(magic, n_stream, bool(v_trans))
    raise UnknownStateFormat("a state without cells")


class _Words:
    """Little-endian 32-bit words read in order from a state."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._at = 0

    def skip(self, n_bytes: int) -> None:
        self._at += n_bytes
        if self._at > len(self._view):
            raise UnknownStateFormat("a state shorter than its cells")

    def next(self) -> int:
        start = self._at
        self.skip(_WORD)
        return int.from_bytes(self._view[start : self._at], "little")

    def skip_cells(self, count: int) -> None:
        """Each cell: its position, its number of sequence ids, the ids (one, for a sequence's
        own state: read at once; any other count: cell by cell)."""
        end = self._at + 3 * _WORD * count
        if end <= len(self._view):
            cells = np.frombuffer(self._view[self._at : end], dtype="<u4").reshape(count, 3)
            if bool((cells[:, 1] == 1).all()):
                self._at = end
                return
        for _ in range(count):
            self.skip(_WORD)  # the position
            self.skip(_WORD * self.next())
