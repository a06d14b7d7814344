"""A client that leaves while a reasoning summary is being written stops both generations."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.counting import CountingScript
from tests.support.responses import MODEL, served


@dataclass
class Server:
    url: str
    engine: LlamaEngine
    script: CountingScript


@pytest.fixture(scope="module")
def server(
    tiny_gguf: Path, encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    script = CountingScript(encoding)
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=16384, n_threads=2), sampling_hook=script
    )
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    try:
        with served(create_app(Settings(responses_store_path=store), runtime)) as url:
            yield Server(url, engine, script)
    finally:
        engine.close()


def test_leaving_during_the_summary_cancels_it_and_the_answer(server: Server) -> None:
    script = server.script
    answer = script.push(
        "<|channel|>analysis<|message|>Think.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>" + "word " * 6000 + "<|return|>"
    )
    summary = script.push("<|channel|>final<|message|>" + "sum " * 6000 + "<|return|>")
    body = {"model": MODEL, "input": "Talk.", "stream": True, "reasoning": {"summary": "auto"}}
    with httpx.stream("POST", f"{server.url}/responses", json=body, timeout=60) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:") and "summary_text.delta" in line)
        assert server.engine.load.running == 2  # the answer and its summary, side by side
    deadline = time.monotonic() + 10
    while server.engine.load.running:
        assert time.monotonic() < deadline, "a generation kept running"
        time.sleep(0.2)
    assert script.sampled < (len(answer) + len(summary)) // 2
    script.push("<|channel|>final<|message|>Still here.<|return|>")
    after = httpx.post(f"{server.url}/responses", json={"model": MODEL, "input": "Hi"}, timeout=60)
    assert json.loads(after.text)["output"][0]["content"][0]["text"] == "Still here."
