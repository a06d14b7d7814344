"""A streaming client that goes away stops its generation; nothing is stored for it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from server.app import create_app
from server.config import Settings
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.runtime import Runtime
from tests.support.forced import ForcedScript
from tests.support.responses import MODEL, served


class CountingScript(ForcedScript):
    """A forced script that also counts the tokens the engine has sampled so far."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        super().__init__(encoding)
        self.sampled = 0

    def __call__(self, prompt_tokens: Sequence[int]) -> Callable[[int], int] | None:
        chooser = super().__call__(prompt_tokens)
        if chooser is None:
            return None

        def counting(sampled: int) -> int:
            self.sampled += 1
            return chooser(sampled)

        return counting


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> CountingScript:
    return CountingScript(encoding)


@pytest.fixture(scope="module")
def base_url(
    tiny_gguf: Path,
    script: CountingScript,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=16384, n_threads=2), sampling_hook=script
    )
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    try:
        with served(create_app(Settings(responses_store_path=store), runtime)) as url:
            yield url
    finally:
        engine.close()


def test_leaving_mid_stream_cancels_the_generation(base_url: str, script: CountingScript) -> None:
    long_answer = script.push("<|channel|>final<|message|>" + "word " * 12000 + "<|return|>")
    body = {"model": MODEL, "input": "Talk.", "stream": True, "store": True}
    with httpx.stream("POST", f"{base_url}/responses", json=body, timeout=60) as response:
        lines = response.iter_lines()
        created = json.loads(next(line for line in lines if line.startswith("data:"))[5:])
        next(line for line in lines if "response.output_text.delta" in line)
    # the connection is closed: the engine stops within moments, long before the script ends
    deadline = time.monotonic() + 10
    previous = -1
    while script.sampled != previous:
        assert time.monotonic() < deadline, "the generation kept running"
        previous = script.sampled
        time.sleep(0.5)
    assert script.sampled < len(long_answer) // 2
    response_id = created["response"]["id"]
    assert httpx.get(f"{base_url}/responses/{response_id}").status_code == 404  # not stored
    script.push("<|channel|>final<|message|>Still here.<|return|>")
    after = httpx.post(f"{base_url}/responses", json={"model": MODEL, "input": "Hi"}, timeout=60)
    assert after.json()["output"][0]["content"][0]["text"] == "Still here."
