"""llama.cpp's RPC backend: other hosts' devices (CPU, CUDA, Metal) used as if they were local.

An `rpc-server` (llama.cpp's, or `gpt-oss-server rpc-worker`) exposes a host's ggml backend over
TCP. ggml's RPC client aborts the whole process when a host cannot be reached, refuses the
handshake (a protocol version mismatch) or drops while a graph is computed. So:

- `connect()` checks every endpoint before llama.cpp touches it: a host name is resolved once
  (hosts.resolve) and from then on only that address is used, by the checks and by ggml (which
  would otherwise resolve the name again at every reconnection); a TCP connect with a bounded
  timeout here, then ggml's own handshake in a child process (`python -m server.engine.rpc.probe`)
  that may abort without taking the server down; only then are the endpoints' devices registered
  in ggml's backend registry (`ggml_backend_rpc_add_server`, `ggml_backend_register`), where
  llama.cpp and the placement see them as GPUs.
- `AbortWatch` turns ggml's abort on a dropped host into a reported failure: ggml calls the hook
  on the RPC client's own thread before `abort()`; the hook tells the engine and then parks that
  thread for good, so `abort()` is never reached. The decode waiting on it never returns; the
  engine ends the requests in flight and reports itself failed (see server.engine.llama).
- `RpcHosts.reconnect()` makes the hosts usable again for the next load after that: ggml keeps
  one connection per endpoint for the process (the failed engine's, stuck for good with its
  waiting thread), and one device set per endpoint, both keyed by the endpoint's spelling; so
  the devices registered so far are retired (the placement skips them) and each host, checked
  again, is registered under a new spelling of its address (the port with leading zeros, which
  ggml reads as the same port): a fresh connection and fresh devices. Before that, the old
  connections are shut down (not closed: ggml owns them): a host serves one client at a time,
  so a surviving host would never answer the new one, and it frees what the failed engine held
  there once that client hangs up. What the failed engine holds here stays held until the
  process ends (its thread waits for good).
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as lc
import psutil

from server.engine.ggml import functions as ggml_functions
from server.engine.ggml import retire
from server.engine.rpc.hosts import RpcError, reachable, resolve, split_endpoint

log = logging.getLogger(__name__)

REINSTALL = (
    'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'
)


@dataclass(frozen=True, slots=True)
class RemoteDevice:
    """One device of an RPC host, registered in ggml's backend registry."""

    endpoint: str  # host:port, as given
    name: str  # ggml's device name (RPC0, RPC1, ...)
    handle: int  # ggml_backend_dev_t


def supports_rpc() -> bool:
    return bool(lc.llama_supports_rpc())


def require_rpc() -> None:
    """Raise RpcError with the reinstall command when this build has no RPC backend."""
    if not supports_rpc():
        raise RpcError(
            "this llama-cpp-python build has no RPC backend (llama_supports_rpc() is false); "
            f"reinstall it with RPC: {REINSTALL}"
        )


def connect(
    endpoints: Sequence[str], timeout_s: float, loopback_only: bool = True
) -> list[RemoteDevice]:
    """Resolve and check each endpoint, then register its devices at the address checked;
    RpcError names the first bad one. `loopback_only`: every address must be this machine's."""
    return RpcHosts(endpoints, timeout_s, loopback_only).connect()


class RpcHosts:
    """The --rpc hosts: resolved once, checked, their devices registered; connected anew for
    a load after an engine's connection to them got stuck (a host dropped)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float, loopback_only: bool) -> None:
        self.endpoints = tuple(endpoints)
        self.timeout_s = timeout_s
        self.loopback_only = loopback_only
        self._addresses: dict[str, str] = {}
        self._connections = 0  # how many times the devices were registered
        self.devices: list[RemoteDevice] = []

    def connect(self) -> list[RemoteDevice]:
        """Resolve (once) and check each endpoint, then register its devices; RpcError names
        the first bad one."""
        require_rpc()
        if not self._addresses:
            self._addresses = {e: resolve(e, self.loopback_only) for e in self.endpoints}
        for endpoint, address in self._addresses.items():
            try:
                reachable(address, self.timeout_s)
            except RpcError as exc:
                if address == endpoint:
                    raise
                raise RpcError(f"{exc} (named {endpoint})") from exc
            handshake(address, self.timeout_s, endpoint)
        times = self._connections
        self.devices = [
            device
            for endpoint in self.endpoints
            for device in register(respelled(self._addresses[endpoint], times), endpoint)
        ]
        self._connections += 1
        return self.devices

    def reconnect(self) -> list[RemoteDevice]:
        """The devices registered so far retired (an engine's connection to them is stuck for
        good), each host checked and registered again under a new spelling; RpcError names a
        host that is still gone (the next reconnect tries again)."""
        retire([device.handle for device in self.devices])
        self.devices = []
        hang_up(self._addresses.values())
        return self.connect()


def hang_up(addresses: Iterable[str]) -> int:
    """Shut down this process's TCP connections to `addresses` (ggml's, to retired devices),
    leaving their file descriptors to ggml; how many."""
    wanted = {split_endpoint(address) for address in addresses}
    count = 0
    for connection in psutil.Process().net_connections(kind="tcp"):
        remote = connection.raddr
        if connection.fd < 0 or not remote or (remote[0], remote[1]) not in wanted:
            continue
        held = socket.socket(fileno=connection.fd)
        try:
            held.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:  # closed meanwhile, or never connected
            pass
        finally:
            held.detach()  # the descriptor stays ggml's
    return count


def respelled(address: str, times: int) -> str:
    """`address` (IPV4:PORT) as ggml takes it for a new connection: the port with `times`
    leading zeros, the same port to ggml's parser and to the socket, another endpoint to
    ggml's per-endpoint connection and device tables."""
    if times == 0:
        return address
    host, port = split_endpoint(address)
    return f"{host}:{'0' * times}{port}"


def handshake(endpoint: str, timeout_s: float, named: str | None = None) -> list[dict[str, Any]]:
    """ggml's own handshake with `endpoint`, in a child process; its devices' memory.

    `named`: how errors name the host (the endpoint as given, when `endpoint` is its address)."""
    command = [sys.executable, "-m", "server.engine.rpc.probe", endpoint]
    endpoint = named or endpoint
    try:
        # the child loads llama.cpp first: allow for that beyond the host's own timeout
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=timeout_s + 20
        )
    except subprocess.TimeoutExpired as exc:
        raise RpcError(f"RPC host {endpoint} accepted the connection but never answered") from exc
    if done.returncode != 0:
        raise RpcError(f"RPC host {endpoint} refused the handshake: {_reason(done.stderr)}")
    try:
        devices: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise RpcError(f"RPC host {endpoint}: unreadable probe output {done.stdout!r}") from exc
    if not devices:
        raise RpcError(f"RPC host {endpoint} offers no device")
    return devices


_SOURCE = re.compile(r"^\S+\.(?:c|cpp|h):\d+: ")  # ggml's "file.cpp:547: " prefix


def abort_reason(message: str) -> str:
    """ggml's abort message without its source-file prefix."""
    return _SOURCE.sub("", message.strip())


def _reason(stderr: str) -> str:
    """The lines of ggml's stderr that say what went wrong."""
    lines = [abort_reason(line) for line in stderr.splitlines() if line.strip()]
    useful = [line for line in lines if "RPC" in line or "rror" in line or "ailed" in line]
    return "; ".join((useful or lines)[-3:]) or "no message"


def register(address: str, endpoint: str | None = None) -> list[RemoteDevice]:
    """Register the devices of the RPC host at `address` (what ggml connects to, at every
    reconnection) in ggml's registry; `endpoint` is how the host was named (the address)."""
    endpoint = endpoint or address
    ggml = ggml_functions()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcError("ggml has no RPC backend registered")
    proc = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(proc)
    server = add_server(address.encode())
    if not server:
        raise RpcError(f"RPC host {endpoint} offers no device")
    ggml.ggml_backend_register(server)
    devices = []
    for i in range(ggml.ggml_backend_reg_dev_count(server)):
        handle = ggml.ggml_backend_reg_dev_get(server, i)
        name = ggml.ggml_backend_dev_name(handle).decode()
        devices.append(RemoteDevice(endpoint=endpoint, name=name, handle=int(handle)))
    return devices


def serve(host: str, port: int, n_threads: int, cache_dir: str | None) -> None:
    """Run ggml's RPC server on this host's devices (never returns).

    Like llama.cpp's rpc-server: every accelerator of this build, else the CPU.
    """
    ggml = ggml_functions()
    local = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    devices = [d for d in local if ggml.ggml_backend_dev_type(d) not in _HOST_TYPES]
    devices = devices or [ggml.ggml_backend_dev_by_type(_CPU)]
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server")
    start = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )(address)
    array = (ctypes.c_void_p * len(devices))(*devices)
    endpoint = f"{host}:{port}"
    cache = cache_dir.encode() if cache_dir else None
    start(endpoint.encode(), cache, n_threads, len(devices), array)


_CPU, _ACCEL = 0, 3  # enum ggml_backend_dev_type
_HOST_TYPES = (_CPU, _ACCEL)
ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


class AbortWatch:
    """While installed, a ggml abort about RPC reports `on_failure(message)` instead of exiting.

    Any other abort (a bug) is logged and goes on to `abort()` as before.
    """

    def __init__(self, on_failure: Callable[[str], None]) -> None:
        self._on_failure = on_failure
        self._callback = ABORT_CALLBACK(self._abort)  # referenced as long as ggml may call it
        self._parked = threading.Event()  # never set: a failed RPC thread waits here for good

    def install(self) -> None:
        ggml_functions().ggml_set_abort_callback(ctypes.cast(self._callback, ctypes.c_void_p))

    def _abort(self, message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", errors="replace")
        if "RPC" not in text and "ggml-rpc" not in text:  # the file name: "Failed to connect"
            log.critical("llama.cpp aborted: %s", text)
            return
        try:
            self._on_failure(text)
        except Exception:  # the report must not let the process abort
            log.exception("reporting the RPC failure failed")
        self._parked.wait()
