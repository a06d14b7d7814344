"""StopFlag: a decode's stop request that llama.cpp reads by itself, without Python.

llama.cpp's CPU backend asks a decode's abort callback between the operations of its graph (66
times in a 512-token decode of the tiny model; the CUDA backend does not ask). A Python callback
takes the GIL for each answer: while the event loop held it (a stream's opening events are made
during its prefill) the prefill stood still; a 515-token decode beside a Python thread busy half
the time took 3.9 ms longer with the Python callback than without one.

The callback is ggml's own `ggml_is_empty(tensor)` instead, given cells of this object as the
tensor: it answers whether any of the tensor's four dimensions is 0. Every cell holds 1 (not
empty: go on) until `set` writes 0 to all of them (stop), so the answer does not depend on where
ggml's struct keeps the dimensions, and the cells span the whole struct (`ggml_tensor_overhead()`
is larger than it). A decode reads them at its own pace: a `set` from another thread is seen at
the next operation, and a half-written row of cells already reads as a stop. A flag serves one
decode: a client's leave seen late (on its own thread, after the decode ended) sets a flag no
decode reads any more.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp.llama_cpp as lc

from server.engine.ggml import functions as ggml_functions

_GO_ON = 1  # a dimension of a tensor with elements


@functools.cache
def _callback() -> Any:
    """`ggml_is_empty` as llama.cpp's abort callback type (a pointer to C code: no Python)."""
    address = ctypes.cast(ggml_functions().ggml_is_empty, ctypes.c_void_p).value
    assert address is not None
    return lc.ggml_abort_callback(address)


@functools.cache
def _cell_count() -> int:
    """Enough 64-bit cells to cover a ggml tensor's struct."""
    return -(-int(ggml_functions().ggml_tensor_overhead()) // ctypes.sizeof(ctypes.c_int64))


class StopFlag:
    """Cells that read, through `ggml_is_empty`, as "stop" once `set`; see the module's text."""

    def __init__(self) -> None:
        count = _cell_count()
        self._cells = (ctypes.c_int64 * count)(*[_GO_ON] * count)
        self.callback = _callback()
        self.data = ctypes.cast(self._cells, ctypes.c_void_p)

    def set(self) -> None:
        """Stop: the running decode ends at its next operation (any thread may call it)."""
        ctypes.memset(self._cells, 0, ctypes.sizeof(self._cells))

    @property
    def is_set(self) -> bool:
        return bool(ggml_functions().ggml_is_empty(self.data))
