"""The ggml backend functions the engine calls, reached through libllama (the bindings do not
wrap them): the device registry (placement, RPC hosts), the abort hook, and the tensor test a
decode's stop flag is read by (stop_flag.py).

ggml's device registry is the process's, and a device stays in it for good; `retire()` marks
the ones no model may use again (an RPC host's devices, once an engine's connection to it is
stuck: every call through them would wait for good), and the placement skips them."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp.llama_cpp as lc

_SIZES = ctypes.POINTER(ctypes.c_size_t)
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "ggml_backend_dev_count": ([], ctypes.c_size_t),
    "ggml_backend_dev_get": ([ctypes.c_size_t], ctypes.c_void_p),
    "ggml_backend_dev_by_type": ([ctypes.c_int], ctypes.c_void_p),
    "ggml_backend_dev_type": ([ctypes.c_void_p], ctypes.c_int),
    "ggml_backend_dev_name": ([ctypes.c_void_p], ctypes.c_char_p),
    "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
    "ggml_backend_dev_memory": ([ctypes.c_void_p, _SIZES, _SIZES], None),
    "ggml_backend_dev_backend_reg": ([ctypes.c_void_p], ctypes.c_void_p),
    "ggml_backend_cpu_buffer_type": ([], ctypes.c_void_p),
    "ggml_backend_reg_count": ([], ctypes.c_size_t),
    "ggml_backend_reg_get": ([ctypes.c_size_t], ctypes.c_void_p),
    "ggml_backend_reg_by_name": ([ctypes.c_char_p], ctypes.c_void_p),
    "ggml_backend_reg_name": ([ctypes.c_void_p], ctypes.c_char_p),
    "ggml_backend_reg_get_proc_address": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p),
    "ggml_backend_register": ([ctypes.c_void_p], None),
    "ggml_backend_reg_dev_count": ([ctypes.c_void_p], ctypes.c_size_t),
    "ggml_backend_reg_dev_get": ([ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p),
    "ggml_set_abort_callback": ([ctypes.c_void_p], ctypes.c_void_p),
    "ggml_is_empty": ([ctypes.c_void_p], ctypes.c_bool),
    "ggml_tensor_overhead": ([], ctypes.c_size_t),
}


_RETIRED: set[int] = set()  # beside ggml's registry, which is as global: the devices retired


def retire(handles: list[int]) -> None:
    """Devices (ggml_backend_dev_t) no model may be placed on again."""
    _RETIRED.update(handles)


def retired(handle: int) -> bool:
    return handle in _RETIRED


@functools.cache
def functions() -> Any:
    """libllama with the signatures above set (once)."""
    lib = lc._lib
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype
    return lib
