"""Fixtures shared by every test layer.

The harmony encoding is loaded offline; the tiny synthetic gpt-oss GGUF is built once per
machine; one real LlamaEngine runs on it for the whole session, with a forced-token hook so a
test can script what the model says.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from devkit.models import cached_gguf
from server.engine.llama import LlamaEngine
from server.harmony.encoding import ENV_VAR, load_encoding
from server.ops.runtime import Runtime
from tests.support.tiny_engine import tiny_engine, tiny_runtime


@pytest.fixture(scope="session", autouse=True)
def _own_prompt_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers the tests start keep their prompt cache in a directory of this run, never in the
    machine's (~/.cache/gpt-oss-server/kv), so no run sees another's entries."""
    name = "GPT_OSS_PROMPT_CACHE_DIR"
    before = os.environ.get(name)
    os.environ[name] = str(tmp_path_factory.mktemp("kv"))
    yield
    if before is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = before


@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vocab")


@pytest.fixture(scope="session")
def encoding(vocab_dir: Path) -> HarmonyEncoding:
    os.environ.pop(ENV_VAR, None)
    return load_encoding(vocab_dir)


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    return cached_gguf("tiny")


@pytest.fixture(scope="session")
def forced(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@pytest.fixture(autouse=True)
def _no_leftover_scripts(request: pytest.FixtureRequest) -> Iterator[None]:
    """A script a test queued but did not use must not leak into the next test."""
    yield
    if "forced" in request.fixturenames:
        request.getfixturevalue("forced").clear()


@pytest.fixture(scope="session")
def engine(tiny_gguf: Path, forced: ForcedScript) -> Iterator[LlamaEngine]:
    with tiny_engine(tiny_gguf, forced) as engine:
        yield engine


@pytest.fixture(scope="session")
def runtime(engine: LlamaEngine, encoding: HarmonyEncoding) -> Runtime:
    return tiny_runtime(engine, encoding)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e is an `e2e` test (a real server and real clients)."""
    e2e = Path(__file__).parent / "e2e"
    for item in items:
        if e2e in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
