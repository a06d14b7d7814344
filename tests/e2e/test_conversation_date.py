"""--conversation-date: the date every API's system message gives the model, instead of today's.

Reproducible runs (evaluations, the trained model's agent tests) need the same prompt tokens on
any day; the date is the one part of a rendered prompt that changes by itself.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.responses import served

MODEL = "gpt-oss-tiny"
ANSWER = "<|channel|>final<|message|>Done.<|return|>"
FIXED = datetime.date(2024, 2, 29)


@pytest.fixture(scope="module")
def url(runtime: Runtime) -> Iterator[str]:
    with served(create_app(Settings(conversation_date=FIXED), runtime)) as base:
        yield base


REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    "responses": ("/responses", {"input": "Hi"}),
    "messages": ("/messages", {"max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}),
}


@pytest.mark.parametrize("api", list(REQUESTS))
def test_every_api_renders_the_fixed_date(
    api: str, url: str, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    path, body = REQUESTS[api]
    forced.push(ANSWER)
    before = len(forced.prompts)
    response = httpx.post(url + path, json={"model": MODEL, **body}, timeout=60)
    assert response.status_code == 200, response.text
    (prompt,) = forced.prompts[before:]
    text = encoding.decode_utf8(prompt)
    assert "Current date: 2024-02-29\n" in text
    assert datetime.date.today().isoformat() not in text
