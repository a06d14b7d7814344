"""Ollama's probes (/api/version, /api/tags, /api/pull, /api/ps) and the model's aliases in
/v1/models, on the real tiny engine: what `codex --oss` asks before it generates."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from server.app import create_app
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings

ALIASES = ("gpt-oss:20b", "openai/gpt-oss-20b")


@pytest.fixture(scope="module")
def client(engine: LlamaEngine, encoding: HarmonyEncoding) -> Iterator[TestClient]:
    runtime = Runtime(engine=engine, encoding=encoding, model_name="gpt-oss-tiny", aliases=ALIASES)
    with TestClient(create_app(Settings(), runtime)) as test_client:
        yield test_client


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_version_is_one_codex_accepts(client: TestClient) -> None:
    body = client.get("/api/version").json()
    major, minor, patch = (int(part) for part in body["version"].split("."))
    assert (major, minor, patch) >= (0, 13, 4)


def test_tags_list_the_model_under_each_name(client: TestClient) -> None:
    models = client.get("/api/tags").json()["models"]
    assert [m["name"] for m in models] == ["gpt-oss-tiny", *ALIASES]
    assert all(m["model"] == m["name"] for m in models)
    assert all(m["size"] > 0 and m["details"]["family"] == "gpt-oss" for m in models)


def test_v1_models_lists_the_aliases(client: TestClient) -> None:
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["gpt-oss-tiny", *ALIASES]
    assert data[1]["meta"]["alias_of"] == "gpt-oss-tiny"
    assert "alias_of" not in data[0]["meta"]


@pytest.mark.parametrize("name", ["gpt-oss:20b", "openai/gpt-oss-20b", "gpt-oss-tiny:latest"])
def test_pulling_a_served_name_succeeds_at_once(client: TestClient, name: str) -> None:
    response = client.post("/api/pull", json={"model": name, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert lines(response.text)[-1] == {"status": "success"}
    assert client.post("/api/pull", json={"name": name, "stream": False}).json() == {
        "status": "success"
    }


def test_pulling_another_model_is_ollamas_error(client: TestClient) -> None:
    streamed = client.post("/api/pull", json={"model": "llama3:8b"})
    assert streamed.status_code == 200  # Ollama reports a failed pull inside the stream
    last = lines(streamed.text)[-1]
    assert set(last) == {"error"}
    assert "'llama3:8b' is not it" in str(last["error"])
    assert "-m gpt-oss-tiny" in str(last["error"])
    plain = client.post("/api/pull", json={"model": "llama3:8b", "stream": False})
    assert plain.status_code == 404
    assert "llama3:8b" in plain.json()["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "invalid JSON in the request body"),
        (b"[1]", "the request body must be a JSON object"),
        (b"{}", "model is required"),
        (b'{"model": 7}', "model is required"),
    ],
)
def test_a_bad_pull_request_is_a_400_in_ollamas_shape(
    client: TestClient, body: bytes, message: str
) -> None:
    response = client.post("/api/pull", content=body)
    assert response.status_code == 400
    assert response.json() == {"error": message}


def test_ps_lists_the_loaded_model(client: TestClient) -> None:
    assert [m["name"] for m in client.get("/api/ps").json()["models"]] == ["gpt-oss-tiny"]


def test_health_and_server_say_the_model_is_loaded(client: TestClient) -> None:
    assert client.get("/health").json()["model_state"] == "loaded"
    facts = client.get("/v1/server").json()
    assert facts["model_state"] == "loaded"
    assert facts["idle_unload_s"] is None
    assert facts["aliases"] == list(ALIASES)
    metrics = client.get("/metrics").text
    assert 'gpt_oss_model_state{state="loaded"} 1.0' in metrics
    assert 'gpt_oss_model_state{state="unloaded"} 0.0' in metrics
