"""Chat Completions logprobs on the real tiny engine: OpenAI's shapes, streamed and folded, the
reasoning tokens under `reasoning_logprobs`, the values the engine's prompt scoring gives, and
clear 400s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.engine.base import SamplingParams
from server.engine.llama import LlamaEngine
from tests.support.chat import USER_HI, chunks_of, joined, post, stream
from tests.support.engine_runs import ACROSS_PATHS
from tests.support.scripts import GREETING, reason_then_answer
from tests.support.tiny_engine import tiny_app, tiny_engine, tiny_runtime


@dataclass
class Fresh:
    """An engine of its own, its forced scripts and its HTTP client: its KV cache holds only
    this module's requests. On the shared engine the chat request reused a prefix whose cells
    other tests' batches had computed (llama.cpp's kernels round differently by batch shape),
    and after some orders of the tests one position's logprob differed from the scoring path's
    by 0.6 nats, the others by about 0.01, while a fresh engine's scoring agreed with the
    scoring path exactly: most likely a flip of the tiny model's choice among its experts. The
    comparison is made where both paths start from the same empty cache."""

    forced: ForcedScript
    engine: LlamaEngine
    client: TestClient


@pytest.fixture
def fresh(tiny_gguf: Path, encoding: HarmonyEncoding) -> Iterator[Fresh]:
    forced = ForcedScript(encoding)
    with (
        tiny_engine(tiny_gguf, forced) as engine,
        TestClient(tiny_app(tiny_runtime(engine, encoding))) as client,
    ):
        yield Fresh(forced, engine, client)


ANSWER = "Hello! 👋 How can I help?"


def joined_bytes(entries: list[dict[str, Any]]) -> str:
    return b"".join(bytes(entry["bytes"]) for entry in entries).decode()


def test_non_stream_content_logprobs(fresh: Fresh, encoding: HarmonyEncoding) -> None:
    forced, engine = fresh.forced, fresh.engine
    script = forced.push(GREETING)
    response = post(fresh.client, messages=USER_HI, logprobs=True, top_logprobs=3)
    assert response.status_code == 200
    body = ChatCompletion.model_validate(response.json())
    assert body.choices[0].message.content == ANSWER
    logprobs = body.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    entries = [entry.model_dump() for entry in logprobs.content]
    assert joined_bytes(entries) == ANSWER  # 👋 spans tokens: bytes, not texts, add up
    content_tokens = encoding.encode(ANSWER)
    assert len(entries) == len(content_tokens)
    for entry, token in zip(entries, content_tokens, strict=True):
        assert len(entry["top_logprobs"]) == 3
        tops = [top["logprob"] for top in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True)
        assert entry["logprob"] <= tops[0] + 1e-9
        assert entry["token"] == encoding.decode([token]) or "\ufffd" in entry["token"]
    assert "reasoning" not in (logprobs.model_extra or {})
    # the engine scoring the same tokens as a prompt gives the same values
    whole = [*forced.prompts[-1], *script]
    scores = score_prompt(engine, whole)
    start = len(whole) - len(script) + script.index(content_tokens[0])
    for entry, score in zip(entries, scores[start : start + len(entries)], strict=True):
        assert score is not None
        assert abs(entry["logprob"] - score) < ACROSS_PATHS


def score_prompt(engine: LlamaEngine, tokens: list[int]) -> list[float | None]:
    async def run() -> list[float | None]:
        stream = engine.submit(tokens, SamplingParams(max_tokens=0, prompt_logprobs=True))
        async for _ in stream:
            pass
        return [None if s is None else s.logprob for s in stream.result.prompt_logprobs]

    return asyncio.run(run())


def test_stream_chunks_carry_their_tokens_logprobs(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push(GREETING)
    datas = stream(client, messages=USER_HI, logprobs=True, top_logprobs=1, reasoning_logprobs=True)
    chunks = chunks_of(datas)
    content: list[dict[str, Any]] = []
    reasoning: list[dict[str, Any]] = []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.logprobs is None:
                assert not choice.delta.content
                continue
            content += [entry.model_dump() for entry in choice.logprobs.content or []]
            reasoning += (choice.logprobs.model_extra or {}).get("reasoning", [])
    assert joined_bytes(content) == joined(chunks, "content") == ANSWER
    assert joined_bytes(reasoning) == joined(chunks, "reasoning") == "User greets. Reply briefly."
    assert all(len(entry["top_logprobs"]) == 1 for entry in content + reasoning)


def test_reasoning_logprobs_folded(client: TestClient, forced: ForcedScript) -> None:
    forced.push(reason_then_answer("Think.", "Done."))
    body = post(client, messages=USER_HI, logprobs=True, reasoning_logprobs=True).json()
    logprobs = body["choices"][0]["logprobs"]
    assert joined_bytes(logprobs["reasoning"]) == "Think."
    assert joined_bytes(logprobs["content"]) == "Done."
    assert all(entry["top_logprobs"] == [] for entry in logprobs["content"])


def test_no_logprobs_unless_asked(client: TestClient, forced: ForcedScript) -> None:
    forced.push(GREETING)
    body = post(client, messages=USER_HI).json()
    assert body["choices"][0]["logprobs"] is None


def test_bad_logprobs_requests_get_a_clear_400(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"reasoning_logprobs": True}, "reasoning_logprobs"),
    ]
    for fields, param in cases:
        response = post(client, messages=USER_HI, **fields)
        assert response.status_code == 400, fields
        error = response.json()["error"]
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"
