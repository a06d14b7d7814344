"""A tool loop over the Responses WebSocket against the same loop over HTTP, by pairs.

`python -m scripts.bench.socket_loop [--rounds 20] [--pairs 3] [--output-words 120]
[--model PATH] [--threads 2] [--out FILE]`

One server in this process (the tiny synthetic model unless `--model`, a forced script per
request so that both transports run the very same loop), one conversation per loop: a developer
message, a user request, then `--rounds` responses, each a reasoning message and an
`exec_command` call whose output (`--output-words` words) goes back, the last one a final
answer. Over HTTP the client sends what Codex sends there: every item so far with `store:
false`, the server finding the conversation's tokens by its exact-token replay. Over the socket
it sends what Codex sends there: `previous_response_id` of the socket's last response and only
the new items. The two loops of a pair run one after the other, the order flipped every pair.

For each round: the time from sending the request to its terminal event at the client, the
tokens the engine evaluated for it (input less cached), the request's bytes. Prints JSON: per
transport the median round time and the mean tokens evaluated a round, and the paired
differences (socket - HTTP) of the loops' total times, with the machine's load average before
and after (a busy machine moves the times, not the token counts).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from devkit.forced import ForcedScript
from devkit.models import cached_gguf
from devkit.serving import served
from server.app import create_app
from server.bench.machine import load_average
from server.bench.report import print_json
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.runtime import Runtime
from server.ops.settings import Settings, default_cache_dir

MODEL_NAME = "gpt-oss-bench"
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    }
]
INSTRUCTIONS = " ".join(
    f"Rule {i}: read the files you are asked about before you answer, and say what you ran."
    for i in range(60)
)  # a developer prefix of some 1.2k tokens, the same in every loop
TERMINALS = ("response.completed", "response.incomplete", "response.failed")
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota")


def call_script(round_: int) -> str:
    return (
        f"<|channel|>analysis<|message|>Round {round_}: read the next file.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        f'<|message|>{{"cmd":"cat part-{round_}.txt"}}<|call|>'
    )


def answer_script() -> str:
    return (
        "<|channel|>analysis<|message|>All parts read.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Every part is read.<|return|>"
    )


def tool_output(round_: int, words: int) -> str:
    return " ".join(f"{WORDS[(round_ + i) % len(WORDS)]}{i}" for i in range(words))


class Loop:
    """One conversation's rounds, as a client keeps them; `send` runs one request."""

    def __init__(self, script: ForcedScript, rounds: int, words: int) -> None:
        self.script = script
        self.rounds = rounds
        self.words = words
        self.opening: list[dict[str, Any]] = [
            {"role": "developer", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Read every part ({uuid.uuid4().hex})."},
        ]

    def run(
        self, send: Callable[[list[dict[str, Any]], list[dict[str, Any]], str | None], Any]
    ) -> list[dict[str, Any]]:
        """Every round's measurements; `send(all_items, new_items, previous_id)` answers the
        terminal response and the request's bytes."""
        items = list(self.opening)
        new = list(self.opening)
        previous: str | None = None
        measured = []
        for round_ in range(self.rounds):
            last = round_ == self.rounds - 1
            self.script.push(answer_script() if last else call_script(round_))
            started = time.perf_counter()
            response, sent_bytes = send(items, new, previous)
            elapsed = time.perf_counter() - started
            assert response["status"] == "completed", response.get("error")
            usage = response["usage"]
            cached = usage["input_tokens_details"]["cached_tokens"]
            measured.append(
                {
                    "round": round_,
                    "s": round(elapsed, 4),
                    "input_tokens": usage["input_tokens"],
                    "evaluated_tokens": usage["input_tokens"] - cached,
                    "request_bytes": sent_bytes,
                }
            )
            previous = response["id"]
            output = response["output"]
            new = []
            if not last:
                call = output[-1]
                assert call["type"] == "function_call", call
                new = [
                    {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": tool_output(round_, self.words),
                    }
                ]
            items = [*items, *output, *new]
        return measured


def http_sender(base: str) -> Callable[..., tuple[dict[str, Any], int]]:
    client = httpx.Client(timeout=600)

    def send(
        items: list[dict[str, Any]], _new: list[dict[str, Any]], _previous: str | None
    ) -> tuple[dict[str, Any], int]:
        body = json.dumps(request_body(items)).encode()
        terminal: dict[str, Any] | None = None
        with client.stream(
            "POST", f"{base}/responses", content=body, headers={"content-type": "application/json"}
        ) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] in TERMINALS:
                        terminal = event["response"]
        assert terminal is not None
        return terminal, len(body)

    return send


def socket_sender(ws: ClientConnection) -> Callable[..., tuple[dict[str, Any], int]]:
    def send(
        _items: list[dict[str, Any]], new: list[dict[str, Any]], previous: str | None
    ) -> tuple[dict[str, Any], int]:
        message = json.dumps(
            {"type": "response.create", **request_body(new), "previous_response_id": previous}
        )
        ws.send(message)
        while True:
            event = json.loads(ws.recv(timeout=600))
            if event["type"] == "error":
                raise RuntimeError(event)
            if event["type"] in TERMINALS:
                return event["response"], len(message.encode())

    return send


def request_body(items: list[dict[str, Any]]) -> dict[str, Any]:
    """What Codex sends besides the input: its tools, store false, a stream."""
    return {
        "model": MODEL_NAME,
        "input": items,
        "tools": TOOLS,
        "store": False,
        "stream": True,
        "reasoning": {"effort": "low"},
    }


def summary(loops: list[list[dict[str, Any]]]) -> dict[str, Any]:
    rounds = [r for loop in loops for r in loop]
    return {
        "loops": len(loops),
        "median_round_s": round(statistics.median(r["s"] for r in rounds), 4),
        "median_loop_s": round(statistics.median(sum(r["s"] for r in loop) for loop in loops), 3),
        "mean_evaluated_tokens_a_round": round(
            statistics.fmean(r["evaluated_tokens"] for r in rounds), 1
        ),
        "evaluated_tokens_a_round": [r["evaluated_tokens"] for r in loops[0]],
        "request_bytes_a_round": [r["request_bytes"] for r in loops[0]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--output-words", type=int, default=120)
    parser.add_argument("--model", type=Path, default=None, help="GGUF; default: the tiny one")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = args.model or cached_gguf("tiny")
    encoding = load_encoding(default_cache_dir() / "vocab", partial(vocabulary_bytes, model))
    script = ForcedScript(encoding)
    config = EngineConfig(model_path=str(model), n_ctx=args.n_ctx, n_threads=args.threads)
    engine = LlamaEngine(config, sampling_hook=script)
    load_before = load_average()
    results: dict[str, list[list[dict[str, Any]]]] = {"http": [], "socket": []}
    try:
        with tempfile.TemporaryDirectory() as state:
            settings = Settings(
                responses_store_path=Path(state) / "responses.sqlite3", prompt_cache=False
            )
            runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL_NAME)
            with served(create_app(settings, runtime)) as root:
                base = f"{root}/v1"
                socket_url = base.replace("http://", "ws://", 1) + "/responses"
                Loop(script, 2, args.output_words).run(http_sender(base))  # warm-up, not counted
                for pair in range(args.pairs):
                    order = ["http", "socket"] if pair % 2 == 0 else ["socket", "http"]
                    for transport in order:
                        loop = Loop(script, args.rounds, args.output_words)
                        if transport == "http":
                            results["http"].append(loop.run(http_sender(base)))
                        else:
                            with connect(socket_url, max_size=None) as ws:
                                results["socket"].append(loop.run(socket_sender(ws)))
    finally:
        engine.close()
    paired = [
        round(sum(r["s"] for r in s) - sum(r["s"] for r in h), 3)
        for h, s in zip(results["http"], results["socket"], strict=True)
    ]
    report = {
        "rounds": args.rounds,
        "pairs": args.pairs,
        "output_words": args.output_words,
        "model": str(model),
        "threads": args.threads,
        "http": summary(results["http"]),
        "socket": summary(results["socket"]),
        "loop_s_socket_minus_http": paired,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "raw": results,
    }
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
