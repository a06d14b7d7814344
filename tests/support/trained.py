"""The server on the trained tiny gpt-oss (the `trained` preset), for unscripted agent tests.

Nothing is forced: a ForcedScript with an empty queue only records the prompts. The server is
greedy by default (temperature 0: clients that send none get the same tokens every run) and
dates every conversation CONVERSATION_DATE (--conversation-date;
devkit/trained/tasks.py), so the server's part of a prompt is the same tokens on any day.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai_harmony import HarmonyEncoding
from starlette.types import ASGIApp

from devkit.forced import ForcedScript
from devkit.models import TRAINED, cached_gguf
from devkit.trained.tasks import CONVERSATION_DATE, MODEL_NAME
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.responses import StreamRecorder, served

MODEL = MODEL_NAME


@dataclass
class TrainedServer:
    url: str  # .../v1
    recorder: Any  # StreamRecorder, or what `recorder` made of the app
    prompts: ForcedScript  # records every generation's prompt; never forces anything


@contextmanager
def trained_server(
    encoding: HarmonyEncoding,
    store_dir: Path,
    n_ctx: int,
    recorder: Callable[[ASGIApp], Any] = StreamRecorder,
) -> Iterator[TrainedServer]:
    logging.getLogger("llama_cpp").setLevel(logging.WARNING)
    hook = ForcedScript(encoding)
    # speculation pinned: "auto" decides from a timing at start, and the output would depend
    # on the machine's speed (batch shapes move logit near-ties)
    config = EngineConfig(
        model_path=str(cached_gguf(TRAINED)), n_ctx=n_ctx, n_threads=2, speculative="off"
    )
    engine = LlamaEngine(config, sampling_hook=hook)
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    settings = Settings(
        responses_store_path=store_dir / "responses.sqlite3",
        responses_keepalive_s=1.0,
        temperature=0.0,
        conversation_date=CONVERSATION_DATE,
    )
    app = recorder(create_app(settings, runtime))
    try:
        with served(app) as url:
            yield TrainedServer(url, app, hook)
    finally:
        engine.close()
