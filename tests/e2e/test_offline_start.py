"""`gpt-oss-server serve` with a model to download and no Hub to download it from.

A real `serve` process with HF_ENDPOINT pointed at a name that cannot resolve (under `.invalid`,
RFC 6761) and at a closed port on this machine: the first fails at once, said once; the second
is tried again briefly, each failure said once, then fails with the same clear error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.serving import free_port
from server.ops.model_source import CONNECT_ATTEMPTS, hub_address
from tests.support.serve_process import command

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def serve_with_hub(endpoint: str, tmp_path: Path) -> tuple[int, str]:
    """Exit status and output of `serve` for a Hub model the cache does not hold."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPT_OSS_", "HF_")) and k.lower() not in PROXY_VARIABLES
    }
    env |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
    args = [
        *command(),
        "serve",
        *("--model", "example-org/absent-GGUF:absent.gguf", "--port", str(free_port())),
        *("--cache-dir", str(tmp_path / "cache")),
        *("--responses-store-path", str(tmp_path / "responses.sqlite3")),
    ]
    done = subprocess.run(args, check=False, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_a_name_that_does_not_resolve_is_final_at_once(tmp_path: Path) -> None:
    status, output = serve_with_hub("https://hub.gpt-oss-server-test.invalid", tmp_path)
    assert status == 1, output
    assert output.count("cannot download example-org/absent-GGUF/absent.gguf") == 1, output
    assert output.count("hub.gpt-oss-server-test.invalid:443 does not resolve") == 1, output
    assert "trying again" not in output
    assert "Retry" not in output  # huggingface-hub's own retries never start
    assert "gpt-oss-server download" in output  # what to do instead


def test_a_closed_port_is_tried_again_briefly_each_failure_said_once(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    status, output = serve_with_hub(f"http://127.0.0.1:{port}", tmp_path)
    assert status == 1, output
    retries = [line for line in output.splitlines() if "trying again" in line]
    assert len(retries) == CONNECT_ATTEMPTS - 1, output
    assert len(set(retries)) == len(retries)  # each said once: attempts numbered apart
    assert output.count(f"127.0.0.1:{port} refuses or drops connections") == 1, output
    assert "Retry" not in output


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, ("hub.example.org", 443, False)),
        ({"HTTPS_PROXY": "http://proxy.local:3128"}, ("proxy.local", 3128, True)),
        (
            {"HTTPS_PROXY": "http://proxy.local:3128", "NO_PROXY": "hub.example.org"},
            ("hub.example.org", 443, False),
        ),
    ],
    ids=["direct", "proxy", "bypassed"],
)
def test_the_address_checked_is_the_first_hop(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: tuple[str, int, bool]
) -> None:
    for name in (*PROXY_VARIABLES, *(v.upper() for v in PROXY_VARIABLES)):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    address = hub_address("https://hub.example.org")
    assert (address.host, address.port, address.via_proxy) == expected


def test_huggingface_hub_warnings_are_printed_once() -> None:
    """The library's own handler is taken off: its messages reach the log once, formatted."""
    script = (
        "from server.cli import configure_logging\n"
        "configure_logging('info')\n"
        "from huggingface_hub.utils import logging as hub_logging\n"
        "hub_logging.get_logger('huggingface_hub.file_download').warning('SAID-ONCE')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert output.count("SAID-ONCE") == 1, output
    assert "WARNING huggingface_hub.file_download: SAID-ONCE" in output
