"""Access at start-up: a server bound beyond loopback without an API key says so, loudly."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # starts `gpt-oss-server serve` processes


def test_all_interfaces_without_a_key_prints_a_loud_warning(start_server: Any) -> None:
    server = start_server("--host", "0.0.0.0")
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 200  # no key needed
    log = server.log()
    banner = log.index("gpt-oss-server is ready")
    warning = log.index("gpt-oss-server listens on all interfaces WITHOUT an API key")
    assert warning > banner  # printed under the banner, where it is seen
    assert "Set --api-key (or GPT_OSS_API_KEY), or bind --host 127.0.0.1." in log
