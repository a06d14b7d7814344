"""`python -m server.engine.rpc.probe HOST:PORT`: ggml's RPC handshake in a throwaway process.

ggml aborts the process that fails to connect or whose protocol version the host refuses; run
here, that abort costs nothing and its message reaches the server through stderr. On success it
prints one JSON line: the host's devices with their memory.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

from server.engine.ggml import functions as ggml_functions
from server.engine.rpc import backend


@backend.ABORT_CALLBACK  # type: ignore[untyped-decorator]
def _abort(message: bytes | None) -> None:
    """ggml's message on stderr and a plain exit (no backtrace: the parent wants one line)."""
    sys.stderr.write((message or b"").decode("utf-8", errors="replace") + "\n")
    sys.stderr.flush()
    os._exit(2)


def main(endpoint: str) -> None:
    ggml = ggml_functions()
    ggml.ggml_set_abort_callback(ctypes.cast(_abort, ctypes.c_void_p))
    devices = []
    for device in backend.register(endpoint):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(device.handle, ctypes.byref(free), ctypes.byref(total))
        devices.append({"name": device.name, "free": free.value, "total": total.value})
    print(json.dumps(devices), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
