"""The chat page's HTTP side: `/` and its static files under a strict CSP, /v1/server's facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings

STATIC = (
    "app.js",
    "api.js",
    "dialog.js",
    "dom.js",
    "markdown.js",
    "messages.js",
    "server.js",
    "tools.js",
)


def test_root_serves_the_page_under_a_strict_policy(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="/static/app.js">' in response.text
    policy = response.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"  # no inline scripts, nothing external
    assert directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert response.headers["x-content-type-options"] == "nosniff"


def test_the_page_loads_nothing_from_elsewhere(client: TestClient) -> None:
    texts = [client.get("/").text, client.get("/static/style.css").text]
    texts += [client.get(f"/static/{name}").text for name in STATIC]
    for text in texts:
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text.replace("https?:", "")
        assert "innerHTML" not in text
        assert "insertAdjacentHTML" not in text
        assert "eval(" not in text


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("app.js", "text/javascript; charset=utf-8"),
        ("markdown.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
def test_static_files_have_their_types(client: TestClient, name: str, media_type: str) -> None:
    response = client.get(f"/static/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    assert "content-security-policy" in response.headers


@pytest.mark.parametrize(
    "path",
    ["/static/missing.js", "/static/__init__.py", "/static/..%2F__init__.py", "/static/../app.py"],
)
def test_only_the_shipped_files_are_served(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "error" in response.json()


def test_server_facts(client: TestClient, runtime: Runtime) -> None:
    facts = client.get("/v1/server").json()
    load = runtime.engine.load
    assert facts["model"] == runtime.model_name
    assert facts["n_ctx"] == runtime.engine.info.n_ctx
    assert facts["slots"] == load.slots
    assert facts["max_waiting"] == load.max_waiting
    assert facts["reasoning_visibility"] == "raw"
    assert facts["reasoning_effort"] == "medium"
    assert facts["temperature"] == 1.0
    assert facts["placement"] is None  # the test runtime was not placed by `serve`
    assert facts["tools"] == {"code_interpreter": False, "web_search": False, "mcp": []}


def test_server_facts_name_the_enabled_tools_and_mcp_servers_by_label_only(
    runtime: Runtime, tmp_path: Path
) -> None:
    config = tmp_path / "mcp.json"
    secret_url = "http://127.0.0.1:9/mcp?token=hidden-token"
    servers = {
        "notes": {"command": "/usr/bin/secret-notes-server", "args": ["--token", "hidden-token"]},
        "docs": {"type": "http", "url": secret_url, "headers": {"Authorization": "Bearer hidden"}},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    settings = Settings(mcp_config=config, browser_tool=True)  # type: ignore[call-arg]
    with TestClient(create_app(settings, runtime)) as client:
        response = client.get("/v1/server")
    assert response.status_code == 200
    tools = response.json()["tools"]
    assert tools == {"code_interpreter": False, "web_search": True, "mcp": ["docs", "notes"]}
    assert "hidden" not in response.text
    assert "secret-notes-server" not in response.text
    assert "127.0.0.1:9" not in response.text


def test_with_a_key_the_page_is_open_and_the_api_is_not(runtime: Runtime) -> None:
    app = create_app(Settings(api_key="sekret"), runtime)  # type: ignore[arg-type]
    with TestClient(app) as client:
        assert client.get("/").status_code == 200
        assert client.get("/static/app.js").status_code == 200
        assert client.get("/v1/server").status_code == 401
        authorized = client.get("/v1/server", headers={"Authorization": "Bearer sekret"})
        assert authorized.status_code == 200
