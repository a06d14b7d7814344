"""The tiny engine the in-process tests run on: the session's shared one (tests/conftest.py) and
any a module needs of its own, built the same way."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi import FastAPI
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings

TEST_N_CTX = 4096
MODEL_NAME = "gpt-oss-tiny"


@contextmanager
def tiny_engine(model: Path, hook: ForcedScript) -> Iterator[LlamaEngine]:
    """A real LlamaEngine on `model`, its picks scripted by `hook`, closed on exit. Speculation
    is on: every test through it runs the drafting and verify paths (forced tokens pass any
    draft; that speculation changes no output is tests/engine/test_speculative.py's comparison
    of two engines)."""
    logging.getLogger("llama_cpp").setLevel(logging.WARNING)
    config = EngineConfig(model_path=str(model), n_ctx=TEST_N_CTX, n_threads=2, speculative="on")
    engine = LlamaEngine(config, sampling_hook=hook)
    try:
        yield engine
    finally:
        engine.close()


def tiny_runtime(engine: LlamaEngine, encoding: HarmonyEncoding) -> Runtime:
    return Runtime(engine=engine, encoding=encoding, model_name=MODEL_NAME)


def tiny_app(runtime: Runtime) -> FastAPI:
    """The server's app as the in-process HTTP tests run it (reasoning effort medium)."""
    return create_app(Settings(reasoning_effort="medium"), runtime)
