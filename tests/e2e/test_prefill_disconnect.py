"""A client that leaves during a long prefill stops it there, not at the end of the prompt.

Claude Code (2.1.331 on) re-sends a request whose stream stays silent past its watchdog; a prompt
that takes longer to evaluate than that would otherwise be evaluated twice, side by side. Here a
streaming /v1/messages client leaves while its prompt is being evaluated in one llama_decode of
the whole prompt (n_batch = the context; on the tiny model that decode takes several seconds):
the decode stops within that call, the engine's sequence is free again at once, and the ubatches
evaluated before the stop stay cached, so the same request sent again continues from them.

(Claude Code's own watchdog fires only after minutes of silence, so the test plays the client
that leaves; the disconnect the server sees is the same.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from anthropic.types import Message
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.responses import served

pytestmark = pytest.mark.slow  # seconds of prompt evaluation on two threads

N_CTX = 32768
WORDS = 10000  # ≈ one token each: one batch of the whole prompt (n_batch below)


@dataclass
class Running:
    root: str
    engine: LlamaEngine


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@pytest.fixture(scope="module")
def running(tiny_gguf: Path, encoding: HarmonyEncoding, script: ForcedScript) -> Iterator[Running]:
    config = EngineConfig(
        model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2, n_batch=N_CTX, n_ubatch=512
    )
    engine = LlamaEngine(config, sampling_hook=script)
    runtime = Runtime(engine=engine, encoding=encoding, model_name="tiny")
    try:
        with served(create_app(Settings(messages_ping_s=0.2), runtime)) as url:
            yield Running(url.removesuffix("/v1"), engine)
    finally:
        engine.close()


def metric(root: str, name: str) -> float:
    text = httpx.get(f"{root}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def wait_for(condition: object, timeout: float) -> float:
    """Seconds until `condition()` held (fails past `timeout`)."""
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - start < timeout, "condition not reached"
        time.sleep(0.01)
    return time.monotonic() - start


BODY = {
    "model": "tiny",
    "max_tokens": 5,
    "stream": True,
    "messages": [{"role": "user", "content": " ".join(["word"] * WORDS)}],
}


def full_prefill_s(root: str) -> float:
    """Seconds this machine takes to answer a prompt of the same length (another text, so
    nothing of it is cached): the yardstick for leaving mid-prefill, whatever the machine."""
    other = {"role": "user", "content": " ".join(["other"] * WORDS)}
    body = {**BODY, "stream": False, "max_tokens": 1, "messages": [other]}
    start = time.monotonic()
    response = httpx.post(f"{root}/v1/messages", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return time.monotonic() - start


def test_a_client_leaving_mid_prefill_stops_the_prefill(
    running: Running, script: ForcedScript
) -> None:
    root, engine = running.root, running.engine
    prefill_s = full_prefill_s(root)
    cancelled = 'gpt_oss_generations_total{reason="cancelled"}'
    before = metric(root, cancelled)
    evaluated_before = metric(root, 'gpt_oss_tokens_total{kind="evaluated"}')
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{root}/v1/messages", json=BODY) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
        wait_for(lambda: engine.load.running == 1, timeout=10)
        time.sleep(prefill_s / 3)  # inside the prefill's one llama_decode, a third of it in
        assert engine.load.running == 1, "the prefill ended before the client left"
    stopped_s = wait_for(lambda: engine.load.running == 0, timeout=30)
    wait_for(lambda: metric(root, cancelled) == before + 1, timeout=5)
    evaluated = metric(root, 'gpt_oss_tokens_total{kind="evaluated"}') - evaluated_before
    assert evaluated < WORDS, "the whole prompt was evaluated after its client left"
    # the rest of the prefill would have taken about two thirds of prefill_s
    assert stopped_s < prefill_s / 2, f"the engine went on for {stopped_s:.2f}s of {prefill_s:.2f}s"
    assert evaluated > 0, "nothing evaluated before the stop was kept"

    # The client sends it again (as Claude Code does): it continues from the kept prefix.
    script.push("<|channel|>final<|message|>Read it.<|return|>")
    body = {**BODY, "stream": False, "max_tokens": 20}
    again = httpx.post(f"{root}/v1/messages", json=body, timeout=300)
    assert again.status_code == 200, again.text
    message = Message.model_validate(again.json())
    assert message.content[0].text == "Read it."  # type: ignore[union-attr]
    # what the first request evaluated, and the head it shared with the yardstick's prompt
    cached = message.usage.cache_read_input_tokens or 0
    assert cached >= evaluated
    assert message.usage.input_tokens + cached >= WORDS
