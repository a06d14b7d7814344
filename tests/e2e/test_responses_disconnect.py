"""A client that goes away stops its generation within one decode step and frees its sequence;
nothing is stored for it. Both APIs, streaming and not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.channel import TokenChannel
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.counting import CountingScript
from tests.support.responses import MODEL, served


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> CountingScript:
    return CountingScript(encoding)


@pytest.fixture(scope="module")
def counted_engine(tiny_gguf: Path, script: CountingScript) -> Iterator[LlamaEngine]:
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=16384, n_threads=2), sampling_hook=script
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def base_url(
    counted_engine: LlamaEngine,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    runtime = Runtime(engine=counted_engine, encoding=encoding, model_name=MODEL)
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    with served(create_app(Settings(responses_store_path=store), runtime)) as url:
        yield url


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


LONG_BODIES = {
    "/chat/completions": {"messages": [{"role": "user", "content": "Talk."}], "max_tokens": 15000},
    "/responses": {"input": "Talk.", "store": True, "max_output_tokens": 15000},
}


def _leave(base_url: str, path: str, streaming: bool) -> None:
    """Start a long generation, read a little of it (streaming) or wait a moment, and leave."""
    body = {"model": MODEL, "stream": streaming, **LONG_BODIES[path]}
    if not streaming:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base_url}{path}", json=body, timeout=1.5)
        return
    with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(8):
            next(line for line in lines if line.startswith("data:"))


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "non-stream"])
@pytest.mark.parametrize("path", list(LONG_BODIES))
def test_leaving_cancels_within_one_decode_step_and_frees_the_sequence(
    base_url: str,
    *,
    script: CountingScript,
    counted_engine: LlamaEngine,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    streaming: bool,
) -> None:
    sampled_at_cancel: list[int] = []
    cancel = TokenChannel.cancel

    def recording_cancel(channel: TokenChannel) -> None:
        cancel(channel)  # first cancel, then read: the count can only have grown since
        sampled_at_cancel.append(script.sampled)

    monkeypatch.setattr(TokenChannel, "cancel", recording_cancel)
    script.sampled = 0
    script.push("<|channel|>final<|message|>" + "word " * 12000 + "<|return|>")
    _leave(base_url, path, streaming)
    deadline = time.monotonic() + 10
    while counted_engine.load.running or counted_engine.load.waiting:
        assert time.monotonic() < deadline, "the sequence was not freed"
        time.sleep(0.01)
    assert sampled_at_cancel, "the generation was never cancelled"
    assert 0 < sampled_at_cancel[0] < 12000
    assert script.sampled - sampled_at_cancel[0] <= 1  # the step under way, then it stops
    monkeypatch.undo()
    script.push("<|channel|>final<|message|>Next.<|return|>")
    after = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
        timeout=60,
    )
    assert after.json()["choices"][0]["message"]["content"] == "Next."
