"""Load control over real HTTP: a full queue answers 429, a client that leaves stops its
generation, and /metrics counts what happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devkit.serving import served
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings

LONG = {"messages": [{"role": "user", "content": "Go on."}], "max_tokens": 100000, "stream": True}


@pytest.fixture(scope="module")
def one_slot_server(tiny_gguf: Path, encoding: object) -> Iterator[tuple[str, LlamaEngine]]:
    """A server with one sequence and room for one waiting request."""
    config = EngineConfig(
        model_path=str(tiny_gguf), n_ctx=8192, n_threads=2, n_slots=1, max_waiting=1
    )
    engine = LlamaEngine(config)
    runtime = Runtime(engine=engine, encoding=encoding, model_name="tiny")  # type: ignore[arg-type]
    with served(create_app(Settings(), runtime)) as root:
        yield root, engine
    engine.close()


def wait_for(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_full_queue_is_a_429_and_leaving_clients_free_their_sequence(
    one_slot_server: tuple[str, LlamaEngine],
) -> None:
    base, engine = one_slot_server
    cancelled_before = metric(base, 'gpt_oss_generations_total{reason="cancelled"}')

    async def scenario() -> None:
        async with (
            httpx.AsyncClient(base_url=base, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=LONG) as running,
        ):
            assert running.status_code == 200
            # The states the test needs, not a proxy for them: the first request generating,
            # then the second one admitted and waiting for the only sequence.
            await asyncio.to_thread(wait_for, lambda: engine.load.running == 1)
            waiting = asyncio.ensure_future(client.post("/v1/chat/completions", json=LONG))
            await asyncio.to_thread(
                wait_for, lambda: engine.load.running == 1 and engine.load.waiting == 1
            )
            refused = await client.post("/v1/chat/completions", json=LONG)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "2"
            error = refused.json()["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert "try again in 2s" in error["message"]
            waiting.cancel()
            # both clients are gone: the running stream and the waiting request stop

    asyncio.run(scenario())
    wait_for(lambda: engine.load.running == 0 and engine.load.waiting == 0)
    wait_for(
        lambda: (
            metric(base, 'gpt_oss_generations_total{reason="cancelled"}') >= cancelled_before + 1
        )
    )
    assert metric(base, 'gpt_oss_requests_total{endpoint="/v1/chat/completions",status="429"}') >= 1
    assert metric(base, "gpt_oss_requests_refused_total") >= 1
    assert metric(base, "gpt_oss_queue_depth_max") == 1  # never deeper than --max-waiting


def test_non_streaming_client_that_leaves_cancels_its_generation(
    one_slot_server: tuple[str, LlamaEngine],
) -> None:
    base, engine = one_slot_server
    cancelled = 'gpt_oss_generations_total{reason="cancelled"}'
    cancelled_before = metric(base, cancelled)
    body = {**LONG, "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/chat/completions", json=body, timeout=1.5)
    # The generation itself was cancelled (it could not have finished: up to 100k tokens in an
    # 8k context ends only at the context's end, never as "cancelled").
    wait_for(lambda: metric(base, cancelled) == cancelled_before + 1)
    wait_for(lambda: engine.load.running == 0)


def test_metrics_report_tokens_and_latency(one_slot_server: tuple[str, LlamaEngine]) -> None:
    base, _ = one_slot_server
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).status_code == 200
    text = httpx.get(f"{base}/metrics").text
    for name in (
        'gpt_oss_tokens_total{kind="prompt"}',
        'gpt_oss_tokens_total{kind="generated"}',
        "gpt_oss_time_to_first_token_seconds_count",
        "gpt_oss_decode_tokens_per_second_count",
        "gpt_oss_queue_depth",
        "gpt_oss_active_sequences",
        'gpt_oss_requests_total{endpoint="/v1/chat/completions",status="200"}',
    ):
        assert name in text, name
    assert metric(base, 'gpt_oss_tokens_total{kind="generated"}') >= 8
