"""`python -m server.ops.healthcheck`: exit 0 when the local server answers /health (for Docker).

It reads the same settings as `serve` (flags aside: GPT_OSS_* variables and the config file), so
it finds the server on the port it was told to use.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from server.ops.settings import Settings

TIMEOUT_S = 4.0
ALL_INTERFACES = ("0.0.0.0", "::", "")


def client_url(host: str, port: int) -> str:
    """The /v1 URL a client on this machine uses for a server bound to host:port."""
    host = "127.0.0.1" if host in ALL_INTERFACES else host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def healthy(settings: Settings) -> bool:
    url = client_url(settings.host, settings.port).removesuffix("/v1") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):  # refused, timed out, HTTP error (URLError is an OSError)
        return False


def main() -> int:
    return 0 if healthy(Settings()) else 1


if __name__ == "__main__":
    sys.exit(main())
