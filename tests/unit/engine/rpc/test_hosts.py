"""RPC hosts as settings: HOST:PORT parsing, the loopback rule, reachability, the worker's checks.

These need no RPC build; the start-up error of a build without RPC is checked where the build
has none (CI's lowest-versions environment).
"""

from __future__ import annotations

import socket
from pathlib import Path

import llama_cpp.llama_cpp as lc
import pytest
from pydantic import ValidationError

from devkit.serving import free_port
from server.contracts.errors import StartupError
from server.engine.rpc.backend import hang_up, respelled
from server.engine.rpc.hosts import (
    RpcError,
    is_loopback,
    reachable,
    resolve,
    split_endpoint,
    unreachable,
)
from server.ops.rpc_worker import WorkerOptions, run_worker
from server.ops.settings import Settings
from server.ops.startup import connect_rpc_hosts


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [("127.0.0.1:50052", ("127.0.0.1", 50052)), (" gpu-box:1 ", ("gpu-box", 1))],
)
def test_endpoints_are_host_and_port(endpoint: str, expected: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["gpu-box", ":50052", "host:", "host:0", "host:70000",
                                      "host:port", "[::1]:50052"])  # fmt: skip
def test_other_endpoints_are_refused(endpoint: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_endpoint(endpoint)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("LocalHost", True),
     ("::1", True), ("[::1]", True), ("10.1.2.3", False), ("0.0.0.0", False), ("::", False),
     ("192.168.1.20", False), ("no-such-host.invalid", False),
     ("ip6-localhost", False)],  # names are not resolved, even those that would be loopback
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_reachability_names_a_refusing_host() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        reachable(open_endpoint, 2.0)
        closed = f"127.0.0.1:{free_port()}"
        with pytest.raises(RpcError, match=f"RPC host {closed} refused the connection"):
            reachable(closed, 2.0)
        assert unreachable([open_endpoint, closed]) == [closed]


def test_rpc_setting_from_flag_variable_and_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPT_OSS_RPC", raising=False)
    assert Settings().rpc == ()
    assert Settings(rpc="127.0.0.1:1, localhost:2").rpc == ("127.0.0.1:1", "localhost:2")
    assert Settings(rpc="127.0.0.1:1,127.0.0.1:1").rpc == ("127.0.0.1:1",)  # registered once
    monkeypatch.setenv("GPT_OSS_RPC", "127.0.0.1:3,127.0.0.1:4")
    assert Settings().rpc == ("127.0.0.1:3", "127.0.0.1:4")
    monkeypatch.delenv("GPT_OSS_RPC")
    config = tmp_path / "gpt-oss-server.toml"
    config.write_text('rpc = ["127.0.0.1:5", "127.0.0.1:6"]\n', encoding="utf-8")
    assert Settings(config=config).rpc == ("127.0.0.1:5", "127.0.0.1:6")


def test_hosts_beyond_loopback_need_trust() -> None:
    with pytest.raises(ValidationError, match="add --rpc-trust-network"):
        Settings(rpc="127.0.0.1:1,10.1.2.3:50052")
    trusted = Settings(rpc="10.1.2.3:50052", rpc_trust_network=True)
    assert trusted.rpc == ("10.1.2.3:50052",)
    with pytest.raises(ValidationError, match="is not HOST:PORT"):
        Settings(rpc="10.1.2.3")


def test_worker_refuses_an_open_address_without_trust(tmp_path: Path) -> None:
    options = WorkerOptions(host="0.0.0.0", port=50052, threads=1, cache_dir=None)
    with pytest.raises(StartupError, match="--trust-network"):
        run_worker(options)


def test_worker_binary_must_be_executable(tmp_path: Path) -> None:
    options = WorkerOptions("127.0.0.1", 50052, 1, None, binary=tmp_path / "rpc-server")
    with pytest.raises(StartupError, match="is not an executable file"):
        run_worker(options)


@pytest.mark.skipif(bool(lc.llama_supports_rpc()), reason="this build has the RPC backend")
def test_a_build_without_rpc_names_the_reinstall() -> None:
    with pytest.raises(StartupError, match='CMAKE_ARGS="-DGGML_RPC=on" pip install'):
        connect_rpc_hosts(Settings(rpc="127.0.0.1:50052"))
    options = WorkerOptions(host="127.0.0.1", port=free_port(), threads=1, cache_dir=None)
    with pytest.raises(StartupError, match="llama_supports_rpc"):
        run_worker(options)


def test_resolve_gives_the_address_to_connect_to() -> None:
    assert resolve("localhost:50052", loopback_only=True) == "127.0.0.1:50052"
    assert resolve("127.0.0.2:1", loopback_only=True) == "127.0.0.2:1"
    assert resolve("10.1.2.3:50052", loopback_only=False) == "10.1.2.3:50052"
    with pytest.raises(RpcError, match=r"10\.1\.2\.3, which is not this machine"):
        resolve("10.1.2.3:50052", loopback_only=True)


def test_a_host_connected_anew_is_another_endpoint_to_ggml_on_the_same_port() -> None:
    """ggml keys its connections and devices by the endpoint's spelling and reads the port as
    a number: leading zeros make a new connection to the same host and port."""
    assert respelled("127.0.0.1:50052", 0) == "127.0.0.1:50052"
    again = [respelled("127.0.0.1:50052", times) for times in (1, 2)]
    assert again == ["127.0.0.1:050052", "127.0.0.1:0050052"]
    assert {split_endpoint(endpoint) for endpoint in again} == {("127.0.0.1", 50052)}


def test_hanging_up_shuts_down_this_process_s_connections_to_a_host_only() -> None:
    """A host serves one client at a time: the retired connections are shut down (the other
    side sees the end) while their descriptors stay open for their owner."""
    listener = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port, other_port = listener.getsockname()[1], other.getsockname()[1]
    ours = socket.create_connection(("127.0.0.1", port))
    kept = socket.create_connection(("127.0.0.1", other_port))
    served, _ = listener.accept()
    served_other, _ = other.accept()
    try:
        assert hang_up([f"127.0.0.1:{port}"]) == 1
        served.settimeout(5)
        assert served.recv(1) == b""  # the host sees the client hang up
        assert ours.fileno() >= 0  # the descriptor is still its owner's
        kept.sendall(b"x")
        assert served_other.recv(1) == b"x"  # another host's connection is untouched
    finally:
        for s in (ours, kept, served, served_other, listener, other):
            s.close()
