"""What current clients ask of the transport, over real HTTP.

Codex 0.171 sends `Accept-Encoding: zstd,gzip` on its streaming /v1/responses request: the stream
must come back uncompressed and unbuffered, each event as it happens. Claude Code probes
`/api/hello` on its base URL (HEAD at start, GET in `claude doctor`) and counts only a 200 as
connected.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.responses import served

KEY = "local-key"
CODEX_HEADERS = {
    "authorization": f"Bearer {KEY}",
    "accept": "text/event-stream",
    "accept-encoding": "zstd,gzip",  # as Codex 0.171 sends it
}


@pytest.fixture(scope="module")
def root(runtime: Runtime) -> Iterator[str]:
    with served(create_app(Settings(api_key=KEY), runtime)) as url:
        yield url.removesuffix("/v1")


def test_a_stream_asked_with_zstd_or_gzip_comes_back_plain_and_as_it_happens(
    root: str, forced: ForcedScript
) -> None:
    forced.push("<|channel|>final<|message|>Plain and prompt.<|return|>")
    body = {"model": "m", "input": " ".join(["word"] * 3000), "stream": True}
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{root}/v1/responses", json=body, headers=CODEX_HEADERS) as response,
    ):
        assert response.status_code == 200
        assert "content-encoding" not in response.headers
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers.get("cache-control") == "no-cache"
        chunks = response.iter_raw()  # the bytes as they came, not decoded
        first = next(chunks)
        first_at = time.monotonic()
        assert first.startswith(b"event: response.created\n"), first[:200]
        rest = b"".join(chunks)
        # the first event left before the prompt was evaluated, not with the rest at the end:
        # nothing held the stream back
        assert time.monotonic() - first_at > 0.05
        assert b"response.completed" not in first
    assert b'"delta":"Plain and prompt."' in rest or b"Plain and prompt." in rest
    assert rest.rstrip().splitlines()[-2] == b"event: response.completed"


def test_api_hello_answers_200_without_a_key(root: str) -> None:
    for method in ("GET", "HEAD"):
        response = httpx.request(method, f"{root}/api/hello", timeout=10)
        assert response.status_code == 200, (method, response.text)
        if method == "GET":
            assert response.json() == {"message": "hello"}
    # the routes that need the key still do
    assert httpx.get(f"{root}/v1/models", timeout=10).status_code == 401
