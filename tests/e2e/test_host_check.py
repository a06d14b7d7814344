"""DNS rebinding and cross-origin pages over real HTTP (uvicorn on 127.0.0.1): a request that
names a foreign host, or comes from a foreign page, is refused before it generates anything;
the loopback names and the chat page keep working."""

from __future__ import annotations

import json

import httpx
import pytest

from devkit.forced import ForcedScript

CHAT = {"model": "gpt-oss-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
ANSWER = "<|channel|>final<|message|>Hello!<|return|>"


def port_of(base_url: str) -> int:
    port = httpx.URL(base_url).port
    assert port is not None
    return port


def test_a_rebound_name_gets_no_generation(base_url: str, forced: ForcedScript) -> None:
    """`curl -H 'Host: evil.example:PORT' -H 'Origin: http://evil.example:PORT' 127.0.0.1:PORT`"""
    port = port_of(base_url)
    headers = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    generations = len(forced.prompts)
    response = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=headers, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_host"
    assert len(forced.prompts) == generations  # nothing reached the engine
    messages = httpx.post(
        f"{base_url}/messages",
        json={**CHAT, "max_tokens": 8},
        headers=headers,
        timeout=30,
    )
    assert messages.status_code == 400
    assert messages.json()["type"] == "error"


def test_a_foreign_page_gets_no_generation(base_url: str, forced: ForcedScript) -> None:
    """A page's no-cors fetch (no preflight, no JSON Content-Type) is refused for its Origin,
    before any body is read; FastAPI would not parse it as JSON either, and the preflight a
    JSON request needs grants nothing."""
    port = port_of(base_url)
    headers = {"Origin": "http://evil.example"}
    generations = len(forced.prompts)
    body = json.dumps(CHAT).encode()
    response = httpx.post(f"{base_url}/chat/completions", content=body, headers=headers, timeout=30)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["type"] == "permission_error"
    preflight = httpx.options(
        f"{base_url}/chat/completions",
        headers={"Origin": f"http://localhost:{port + 1}", "Access-Control-Request-Method": "POST"},
        timeout=30,
    )
    assert preflight.status_code == 403
    assert "access-control-allow-origin" not in preflight.headers
    assert len(forced.prompts) == generations


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "[::1]"])
def test_the_loopback_names_and_the_chat_page_work(
    base_url: str, forced: ForcedScript, name: str
) -> None:
    port = port_of(base_url)
    origin = f"http://{name}:{port}"  # the chat page's requests: its own origin
    headers = {"Host": f"{name}:{port}", "Origin": origin}
    forced.push(ANSWER)
    response = httpx.post(f"{base_url}/chat/completions", json=CHAT, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello!"
    page = httpx.get(base_url.removesuffix("/v1") + "/", headers={"Host": f"{name}:{port}"})
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
