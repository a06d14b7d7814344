"""Host and Origin checks in-process: DNS rebinding and cross-origin pages are refused in the
API's error envelope; loopback names, IP addresses, the bound name and allowed names work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic_settings import CliApp

from devkit.forced import ForcedScript
from server.app import create_app
from server.cli import Serve
from server.ops.runtime import Runtime
from server.ops.settings import Settings

CHAT = {"model": "gpt-oss-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
MESSAGE = {
    "model": "gpt-oss-tiny",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "Hi"}],
}
ANSWER = "<|channel|>final<|message|>Hello!<|return|>"


def app_client(runtime: Runtime, **settings: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(**settings), runtime)) as client:
        yield client


@pytest.fixture(scope="module")
def client(runtime: Runtime) -> Iterator[TestClient]:
    yield from app_client(runtime)


@pytest.mark.parametrize(
    "host", ["evil.example:8000", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io"]
)
def test_a_foreign_host_is_refused_in_openai_envelope(client: TestClient, host: str) -> None:
    origin = f"http://{host}"
    response = client.post(
        "/v1/chat/completions", json=CHAT, headers={"Host": host, "Origin": origin}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_host"
    assert host in error["message"]
    assert "--allowed-hosts" in error["message"]
    assert client.get("/", headers={"Host": host}).status_code == 400  # the chat page too


def test_a_foreign_host_is_refused_in_anthropic_envelope(client: TestClient) -> None:
    response = client.post("/v1/messages", json=MESSAGE, headers={"Host": "evil.example:8000"})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "DNS rebinding" in body["error"]["message"]


@pytest.mark.parametrize(
    "host",
    [
        "localhost:8000",
        "LOCALHOST",
        "127.0.0.1:8000",
        "127.1.2.3",
        "[::1]:8000",
        "[::1]",
        "192.168.1.20:8000",
        "testserver",
    ],
)
def test_loopback_names_and_addresses_are_served(
    client: TestClient, forced: ForcedScript, host: str
) -> None:
    forced.push(ANSWER)
    origin = f"http://{host}"  # the chat page's own origin: same host and port
    response = client.post(
        "/v1/chat/completions", json=CHAT, headers={"Host": host, "Origin": origin}
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello!"
    page = client.get("/", headers={"Host": host})
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "http://localhost:3000",  # another page on this machine, another port
        "http://127.0.0.1:8001",
        "https://127.0.0.1:8000",  # another scheme: another port by default
        "null",  # sandboxed frames, file:// pages
        "chrome-extension://abcdef",
    ],
)
def test_a_foreign_origin_is_refused(client: TestClient, origin: str) -> None:
    headers = {"Host": "127.0.0.1:8000", "Origin": origin}
    response = client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["type"] == "permission_error"
    assert error["code"] == "cross_origin_request"
    assert origin in error["message"]
    messages = client.post("/v1/messages", json=MESSAGE, headers=headers)
    assert messages.status_code == 403
    assert messages.json()["error"]["type"] == "permission_error"


def test_a_simple_request_from_a_foreign_page_generates_nothing(
    client: TestClient, forced: ForcedScript
) -> None:
    """A form post or no-cors fetch needs no preflight: refused for its Origin before any body
    is read (FastAPI would not parse a non-JSON Content-Type as JSON either)."""
    generations = len(forced.prompts)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Host": "127.0.0.1:8000", "Origin": "http://evil.example"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        response = client.post("/v1/chat/completions", content=json.dumps(CHAT), headers=headers)
        assert response.status_code == 403, content_type
    assert len(forced.prompts) == generations


def test_a_cors_preflight_grants_nothing(client: TestClient) -> None:
    headers = {
        "Host": "127.0.0.1:8000",
        "Origin": "http://evil.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization",
    }
    response = client.options("/v1/chat/completions", headers=headers)
    assert response.status_code == 403  # refused by the check (no route would answer 405)
    assert response.json()["error"]["code"] == "cross_origin_request"
    assert not any(name.lower().startswith("access-control-") for name in response.headers)
    same_origin = {**headers, "Origin": "http://127.0.0.1:8000"}
    response = client.options("/v1/chat/completions", headers=same_origin)
    assert response.status_code == 405  # let through: no route answers a preflight
    assert not any(name.lower().startswith("access-control-") for name in response.headers)


def test_clients_without_origin_are_served(client: TestClient, forced: ForcedScript) -> None:
    forced.push(ANSWER)
    response = client.post("/v1/chat/completions", json=CHAT, headers={"Host": "127.0.0.1:1"})
    assert response.status_code == 200, response.text


def test_allowed_hosts_name_more_hosts_and_origins(runtime: Runtime, forced: ForcedScript) -> None:
    for client in app_client(runtime, allowed_hosts="chat.example, *.lan, Box.Example:8000"):
        for host in (
            "chat.example",
            "chat.example:443",
            "box.lan:8000",
            "a.b.lan",
            "box.example:9",
        ):
            forced.push(ANSWER)
            response = client.post("/v1/chat/completions", json=CHAT, headers={"Host": host})
            assert response.status_code == 200, (host, response.text)
        for host in ("other.example", "lan", "chat.example.evil"):
            response = client.post("/v1/chat/completions", json=CHAT, headers={"Host": host})
            assert response.status_code == 400, host
        # behind a proxy that rewrites Host: the page's origin is the proxy's name
        forced.push(ANSWER)
        headers = {"Host": "127.0.0.1:8000", "Origin": "https://chat.example"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        headers["Origin"] = "https://evil.example"
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 403


def test_allowed_hosts_star_allows_any(runtime: Runtime, forced: ForcedScript) -> None:
    for client in app_client(runtime, allowed_hosts="*"):
        forced.push(ANSWER)
        headers = {"Host": "anything.example", "Origin": "https://page.example"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200


def test_the_bound_name_is_served(runtime: Runtime, forced: ForcedScript) -> None:
    for client in app_client(runtime, host="myserver.lan"):
        forced.push(ANSWER)
        headers = {"Host": "MyServer.lan:8000", "Origin": "http://myserver.lan:8000"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        headers = {"Host": "other.lan:8000"}
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 400


def test_allowed_hosts_from_a_flag_the_environment_and_the_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve = CliApp.run(Serve, cli_args=["--allowed-hosts", "a.lan,*.B.lan"], cli_cmd_method_name="")
    assert serve.allowed_hosts == ("a.lan", "*.b.lan")
    monkeypatch.setenv("GPT_OSS_ALLOWED_HOSTS", "Chat.Example,,box.lan ")
    assert Settings().allowed_hosts == ("chat.example", "box.lan")
    monkeypatch.delenv("GPT_OSS_ALLOWED_HOSTS")
    config = tmp_path / "server.toml"
    config.write_text('allowed_hosts = ["proxy.example"]\n', encoding="utf-8")
    assert Settings(config=config).allowed_hosts == ("proxy.example",)
