"""Command-line clients from npm (Codex, Claude Code, pi, Cline), installed once per machine into a
cache, at the versions devkit/client_pins.py pins.

Where npm is missing the test is skipped with the reason, except under GPT_OSS_REQUIRE_CLIENTS=1
(CI), where a missing client is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding

from devkit.client_pins import NpmClient
from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings, default_cache_dir
from tests.support.anthropic import Exchange, ExchangeRecorder
from tests.support.responses import served

REQUIRE_ENV = "GPT_OSS_REQUIRE_CLIENTS"


def cache_dir(name: str) -> Path:
    """`~/.cache/gpt-oss-server/<name>`: where a pinned client is installed."""
    return default_cache_dir() / name


def unavailable(reason: str) -> None:
    """Skip the test for `reason`, or fail it where clients are required (CI)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
    pytest.skip(reason)


def installed(package: str, version: str, binary: str, directory: Path) -> Path:
    """`node_modules/.bin/<binary>` of `package@version`, installed into `directory` if absent.

    The install goes to a staging directory first and is renamed into place, so an interrupted
    or concurrent install never leaves a half-installed client behind.
    """
    path = directory / "node_modules" / ".bin" / binary
    if path.exists():
        return path
    npm = shutil.which("npm")
    if npm is None:
        unavailable(f"npm is needed to install {package}@{version} for this test (Node.js)")
    assert npm is not None
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{directory.name}-install-", dir=directory.parent))
    command = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund"]
    result = subprocess.run(
        [*command, f"{package}@{version}"], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        unavailable(f"npm could not install {package}@{version}:\n{result.stderr[-2000:]}")
    try:
        staging.rename(directory)
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return path


def pinned(package: str, version: str, binary: str, directory: Path) -> Path:
    """The client, installed if absent (see `installed`), and checked to be that version."""
    path = installed(package, version, binary, directory)
    answer = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert version in answer.stdout + answer.stderr, answer.stdout + answer.stderr  # pi: stderr
    return path


def pinned_client(client: NpmClient) -> Path:
    """The client's binary at its pinned version (or the version its environment names),
    installed if absent."""
    return pinned(client.package, client.version, client.binary, client.directory())


def run_json_lines(
    command: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 300
) -> tuple[int, list[dict[str, Any]], str]:
    """A client run headless (stdin closed): its exit status, the JSON objects it printed one
    per line on stdout, and its stderr."""
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = result.stdout.splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return result.returncode, events, result.stderr


@dataclass
class RecordedServer:
    url: str  # the /v1 base URL
    recorder: ExchangeRecorder  # every request the client made, and each answer


@contextmanager
def recorded_server(
    model: Path, script: ForcedScript, encoding: HarmonyEncoding, *, n_ctx: int, name: str, key: str
) -> Iterator[RecordedServer]:
    """The server a client CLI runs against: the tiny engine with forced scripts, served on
    127.0.0.1 under the model name `name` with the API key `key`, every exchange recorded."""
    engine = LlamaEngine(
        EngineConfig(model_path=str(model), n_ctx=n_ctx, n_threads=2), sampling_hook=script
    )
    runtime = Runtime(engine=engine, encoding=encoding, model_name=name)
    recorder = ExchangeRecorder(create_app(Settings(api_key=key), runtime))
    try:
        with served(recorder) as url:
            yield RecordedServer(url, recorder)
    finally:
        engine.close()


def streamed_chats(exchanges: list[Exchange], key: str) -> list[Exchange]:
    """A client's run: every request answered 200; its chat requests sent with `key`, streamed,
    and each stream ended with `[DONE]`. Returns the chat requests."""
    assert [(e.method, e.path, e.status) for e in exchanges if e.status != 200] == []
    chats = [e for e in exchanges if e.path == "/v1/chat/completions"]
    assert chats, [e.path for e in exchanges]
    for chat in chats:
        assert chat.headers["authorization"] == f"Bearer {key}"
        assert chat.json()["stream"] is True
        assert chat.content_type.startswith("text/event-stream")
        assert chat.response.rstrip().endswith(b"data: [DONE]")
    return chats
