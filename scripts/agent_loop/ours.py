"""This server, in-process: the real engine with forced scripts behind uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from devkit.serving import served
from scripts.agent_loop.conversation import Turn, first_request, next_input, turns
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.runtime import Runtime
from server.ops.settings import Settings


@dataclass
class Round:
    """One request of the loop, as the client and the server saw it."""

    conversation: str
    label: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: float
    prefill_ms: float  # the engine's prompt evaluation time (from /metrics)
    output: list[int] = field(default_factory=list)  # the tokens the model was made to write
    new_tokens: int = 0  # filled in by `with_new_tokens`

    @property
    def evaluated_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass
class Conversation:
    name: str
    encoding: HarmonyEncoding
    rounds: int
    output_tokens: int
    seed: int
    brief: bool = False
    request: dict[str, Any] = field(init=False)
    pending: Iterator[Turn] = field(init=False)

    def __post_init__(self) -> None:
        self.request = first_request(self.name, brief=self.brief)
        self.pending = turns(self.encoding, self.rounds, self.output_tokens, self.seed)


@contextmanager
def serving(
    model: Path, n_ctx: int, threads: int, cache: Path
) -> Iterator[tuple[str, ForcedScript]]:
    encoding = load_encoding(cache / "vocab", lambda: vocabulary_bytes(model))
    forced = ForcedScript(encoding)
    engine = LlamaEngine(
        EngineConfig(model_path=str(model), n_ctx=n_ctx, n_threads=threads), forced
    )
    settings = Settings(responses_store_path=cache / "responses.sqlite3")
    app = create_app(settings, Runtime(engine=engine, encoding=encoding, model_name="gpt-oss"))
    try:
        with served(app) as root:
            yield root, forced
    finally:
        engine.close()


def run_conversations(
    base: str, forced: ForcedScript, conversations: list[Conversation]
) -> list[Round]:
    """Alternate between the conversations, one request each, until all are done."""
    rounds: list[Round] = []
    active = list(conversations)
    with httpx.Client(base_url=base, timeout=None) as client:
        while active:
            for conv in list(active):
                turn = next(conv.pending, None)
                if turn is None:
                    active.remove(conv)
                    continue
                script = forced.push(turn.script)
                before = prefill_seconds(client)
                result, output = _respond(client, conv.request)
                prefill_ms = (prefill_seconds(client) - before) * 1000
                rounds.append(Round(conv.name, turn.label, **result, prefill_ms=prefill_ms,
                                    output=script))  # fmt: skip
                conv.request["input"] = next_input(conv.request["input"], output, turn.follow_up)
    return with_new_tokens(rounds)


def prefill_seconds(client: httpx.Client) -> float:
    """The server's total prompt evaluation time so far, from its Prometheus metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('gpt_oss_engine_seconds_total{phase="prefill"}'):
            return float(line.split()[-1])
    return 0.0


def _respond(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    sent = time.perf_counter()
    first_output = 0.0
    completed: dict[str, Any] = {}
    with client.stream("POST", "/v1/responses", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event["type"] == "response.output_item.added" and not first_output:
                first_output = time.perf_counter()
            if event["type"] == "response.completed":
                completed = event["response"]
    usage = completed["usage"]
    result = {
        "prompt_tokens": usage["input_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "completion_tokens": usage["output_tokens"],
        "ttft_ms": (first_output - sent) * 1000,
    }
    return result, completed["output"]


def with_new_tokens(rounds: list[Round]) -> list[Round]:
    """New tokens of a round: its prompt minus the previous round's prompt and output."""
    last: dict[str, Round] = {}
    for r in rounds:
        before = last.get(r.conversation)
        seen = before.prompt_tokens + before.completion_tokens if before else 0
        r.new_tokens = r.prompt_tokens - seen
        last[r.conversation] = r
    return rounds
