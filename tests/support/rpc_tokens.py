"""`python -m tests.support.rpc_tokens MODEL N_GPU_LAYERS [HOST:PORT,...]`: greedy token ids.

Loads the model the way `serve` does (RPC hosts connected and registered, the placement planned,
the engine built with its device list and split) and prints one JSON line: the placement's log
lines and the greedy continuation of a fixed prompt. A child process of the test, because RPC
devices, once registered, belong to the whole process (and a host that drops ends it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from dataclasses import replace
from pathlib import Path

from server.engine.base import SamplingParams
from server.engine.llama import LlamaEngine
from server.harmony.tokens import END, MESSAGE, START
from server.ops.settings import Settings
from server.ops.startup import engine_config, start_engine

# <|start|>system<|message|>You are a helpful model.<|end|><|start|>user<|message|>
PROMPT = [START, 17360, MESSAGE, 3575, 553, 261, 10297, 2359, 13, END, START, 1428, MESSAGE]


async def greedy(engine: LlamaEngine, n_tokens: int) -> list[int]:
    stream = engine.submit(PROMPT, SamplingParams(max_tokens=n_tokens, temperature=0.0))
    return [token async for chunk in stream for token in chunk]


class _Assignments(logging.Handler):
    """llama.cpp's own word on where each layer went ("layer 1 assigned to device RPC0")."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.devices: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"layer +(\d+) assigned to device (\S+),", record.getMessage())
        if found:
            self.devices[int(found.group(1))] = found.group(2)


def main(model: str, n_gpu_layers: str, rpc: str = "") -> None:
    assignments = _Assignments()
    llama_log = logging.getLogger("llama_cpp")
    llama_log.setLevel(logging.DEBUG)
    llama_log.addHandler(assignments)
    settings = Settings(model=model, n_gpu_layers=n_gpu_layers, rpc=rpc, n_ctx=1024, n_slots=1)
    config = replace(engine_config(settings, Path(model)), n_threads=1)
    engine, placement = start_engine(settings, config)
    try:
        tokens = asyncio.run(greedy(engine, 48))
    finally:
        engine.close()
    report = {"placement": list(placement.lines), "layers": assignments.devices, "tokens": tokens}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
