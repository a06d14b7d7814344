"""schemathesis against the server's own OpenAPI schema: hostile input never gets a 5xx.

Requests are generated from /openapi.json, both valid ones and ones that break the schema
(wrong types, missing fields, out-of-range numbers), and sent in-process to create_app() on the
real tiny engine. Its context is small, and every generation is forced to a short harmony
output (an answer, a call, a tool nobody offered), so a run stays quick. Every answer must be
below 500; every error must be OpenAI's envelope. The number of requests sent is asserted.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openai_harmony import HarmonyEncoding
from schemathesis import Case, GenerationMode
from schemathesis.python import asgi

from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.settings import Settings
from tests.support.tiny_engine import tiny_runtime

pytestmark = pytest.mark.slow  # hundreds of generated requests

N_POSITIVE, N_NEGATIVE = 100, 150
SCRIPTS = (
    "<|channel|>final<|message|>ok<|return|>",
    "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>"
    '{"a": 1}<|return|>',
    "<|channel|>commentary to=functions.x <|constrain|>json<|message|>{}<|call|>",
    "<|channel|>final<|message|>Hi<|end|>stray",  # leaves the grammar; max tokens ends it
)
RUN = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class ShortScripts:
    """A sampling hook that forces one of a few short outputs on every generation."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        scripts = [encoding.encode(s, allowed_special="all") for s in SCRIPTS]
        self._scripts = itertools.cycle(scripts)

    def __call__(self, prompt_tokens: Sequence[int]) -> Callable[[int], int]:
        script = iter(next(self._scripts))
        return lambda sampled: next(script, 200002)  # then <|return|>, a stop token


@pytest.fixture(scope="module")
def app_schema(
    tiny_gguf: Path, encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2)
    engine = LlamaEngine(config, sampling_hook=ShortScripts(encoding))
    runtime = tiny_runtime(engine, encoding)
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    app = create_app(Settings(responses_store_path=store, max_request_bytes=256 * 1024), runtime)
    try:
        yield schemathesis.openapi.from_asgi("/openapi.json", app)
    finally:
        asgi.shutdown_lifespans()  # the app's lifespan (its store) ends before its engine
        engine.close()


def check(case: Case[Any], sent: list[tuple[str, int]]) -> None:
    response = case.call(timeout=60)
    sent.append((case.operation.label, response.status_code))
    assert response.status_code < 500, (case.as_curl_command(), response.text)
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert error["message"], response.text
        assert error["type"], response.text


@pytest.mark.parametrize(
    ("mode", "n"), [(GenerationMode.POSITIVE, N_POSITIVE), (GenerationMode.NEGATIVE, N_NEGATIVE)]
)
def test_no_request_from_the_schema_gets_a_5xx(
    app_schema: Any, mode: GenerationMode, n: int
) -> None:
    sent: list[tuple[str, int]] = []

    @settings(RUN, max_examples=n)
    @given(case=app_schema.as_strategy(mode))
    def fuzz(case: Case[Any]) -> None:
        check(case, sent)

    fuzz()
    counts = Counter(sent)
    print(f"schemathesis {mode.value}: {len(sent)} requests: {sorted(counts.items())}")
    assert len(sent) >= n
    assert all(status < 500 for _, status in sent)


def test_each_operation_of_the_schema_has_its_own_id(app_schema: Any) -> None:
    """Generated clients and schemathesis key operations by operationId: a route serving two
    methods (GET and HEAD) must not publish the same id twice."""
    ids = [
        operation["operationId"]
        for path in app_schema.raw_schema["paths"].values()
        for operation in path.values()
        if isinstance(operation, dict) and "operationId" in operation
    ]
    assert ids
    assert len(ids) == len(set(ids)), sorted(i for i, n in Counter(ids).items() if n > 1)
