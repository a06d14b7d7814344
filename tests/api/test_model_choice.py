"""One model served: a request's `model` is any name, as a single-model server always took it
(echoed back as asked), on every API; no name at all is the model's own id."""

from __future__ import annotations

from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from tests.support.scripts import GREETING
from tests.support.tiny_engine import MODEL_NAME

HI = [{"role": "user", "content": "hi"}]


def test_any_name_is_the_one_model(client: TestClient, forced: ForcedScript) -> None:
    forced.push(GREETING)
    chat = client.post("/v1/chat/completions", json={"model": "gpt-5", "messages": HI})
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == "gpt-5"
    forced.push(GREETING)
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": HI}
    message = client.post("/v1/messages", json=body)
    assert message.status_code == 200, message.text
    assert message.json()["model"] == "claude-sonnet-4-5"
    forced.push(GREETING)
    response = client.post("/v1/responses", json={"model": "o3", "input": "hi"})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "o3"


def test_no_name_is_the_models_id(client: TestClient, forced: ForcedScript) -> None:
    forced.push(GREETING)
    chat = client.post("/v1/chat/completions", json={"messages": HI})
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == MODEL_NAME


def test_one_model_is_retrieved_by_its_names_only(client: TestClient) -> None:
    assert client.get(f"/v1/models/{MODEL_NAME}").json()["id"] == MODEL_NAME
    missing = client.get("/v1/models/gpt-5")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
