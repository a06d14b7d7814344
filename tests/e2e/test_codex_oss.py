"""The real Codex CLI's `--oss` mode against the server, as a new user runs it: no Codex config,
only CODEX_OSS_BASE_URL, `codex exec --oss --local-provider ollama|lmstudio`.

The server runs the real tiny engine under the names Codex asks for (gpt-oss:20b,
openai/gpt-oss-20b) with --idle-unload on, and every run starts with the model unloaded: Codex's
probes are answered without loading it, and its first request loads it again. Forced scripts
choose the answer. What --oss leaves out next to `codex-config --write` is measured here too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai_harmony import HarmonyEncoding
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from devkit.client_pins import CODEX
from devkit.codex_cli import codex_exec
from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from server.ops.startup import idle_unloading, model_aliases
from tests.support.npm_cli import pinned_client
from tests.support.responses import StreamRecorder, served

pytestmark = pytest.mark.slow  # the real Codex CLI; the model is loaded again for every run

N_CTX = 16384  # Codex's first prompt is ≈7k tokens
MODEL = "gpt-oss-tiny"
ANSWER = "Hello from gpt-oss-server."
FINAL = f"<|channel|>final<|message|>{ANSWER}<|return|>"


class PathLog:
    """ASGI middleware: (method, path, status) of every request, in order."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, record)


@dataclass
class Server:
    url: str  # .../v1
    paths: PathLog
    recorder: StreamRecorder
    script: ForcedScript

    def get(self, path: str) -> dict[str, Any]:
        return dict(httpx.get(self.url.removesuffix("/v1") + path).json())

    def wait_unloaded(self) -> None:
        deadline = time.monotonic() + 60
        while self.get("/health")["model_state"] != "unloaded":
            assert time.monotonic() < deadline, "the model was not unloaded"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def server(
    tiny_gguf: Path, encoding: HarmonyEncoding, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The server with --idle-unload 1s, wired as `serve` wires it (server.ops.startup)."""
    script = ForcedScript(encoding)
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_threads=2)
    settings = Settings(
        idle_unload="1s",
        responses_store_path=tmp_path_factory.mktemp("store") / "responses.sqlite3",
        responses_keepalive_s=1.0,
    )
    engine = LlamaEngine(config, sampling_hook=script)
    residency = idle_unloading(settings, engine, lambda: LlamaEngine(config, script))
    aliases = model_aliases(settings, engine.info.n_params)
    runtime = Runtime(residency, encoding, MODEL, aliases=aliases, residency=residency)
    recorder = StreamRecorder(create_app(settings, runtime))
    paths = PathLog(recorder)
    try:
        with served(paths) as url:
            yield Server(url, paths, recorder, script)
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def codex_binary() -> Path:
    return pinned_client(CODEX)


@dataclass
class OssRun:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    paths: list[tuple[str, str, int]]  # what Codex asked the server, in order
    bodies: list[dict[str, Any]]  # its /v1/responses bodies

    @property
    def answer(self) -> str:
        items = [e["item"] for e in self.events if e["type"] == "item.completed"]
        return " ".join(i["text"] for i in items if i["type"] == "agent_message")


def run_oss(
    codex_binary: Path, server: Server, tmp_path: Path, provider: str, *args: str
) -> OssRun:
    """`codex exec --oss` as a new user runs it: an empty CODEX_HOME, the base URL in the
    environment; the model unloaded first."""
    server.wait_unloaded()
    home = tmp_path / "codex-home"
    home.mkdir()
    before_paths, before_bodies = len(server.paths.seen), len(server.recorder.requests)
    done = codex_exec(
        codex_binary, home, tmp_path, "--oss", "--local-provider", provider, *args, "Say hello.",
        timeout=180, extra_env={"CODEX_OSS_BASE_URL": server.url},
    )  # fmt: skip
    posted = server.recorder.requests[before_bodies:]
    bodies = [json.loads(body) for path, _, body in posted if path.endswith("/responses")]
    return OssRun(
        done.returncode, done.events, done.stderr, server.paths.seen[before_paths:], bodies
    )


def test_ollama_mode_works_from_an_unloaded_model(
    codex_binary: Path, server: Server, tmp_path: Path
) -> None:
    reloads = server.get("/v1/server")["reloads"]
    server.script.push(FINAL)
    run = run_oss(codex_binary, server, tmp_path, "ollama")
    assert run.returncode == 0, run.stderr
    assert run.answer == ANSWER
    probes = [(method, path) for method, path, _ in run.paths if not path.endswith("/responses")]
    assert probes == [("GET", "/v1/models"), ("GET", "/api/version"), ("GET", "/api/tags")]
    assert all(status == 200 for _, _, status in run.paths)  # no pull: gpt-oss:20b is listed
    (body,) = run.bodies
    assert body["model"] == "gpt-oss:20b"
    assert server.get("/v1/server")["reloads"] == reloads + 1  # its request loaded the model


def test_ollama_mode_loses_apply_patch_and_the_effort(
    codex_binary: Path, server: Server, tmp_path: Path
) -> None:
    """What --oss sends, next to the codex-config setup (tests/e2e/test_codex.py): Codex's
    metadata for an unknown slug registers no apply_patch (openai/codex #11940), sends no
    reasoning effort and asks for reasoning summaries."""
    server.script.push(FINAL)
    run = run_oss(codex_binary, server, tmp_path, "ollama")
    assert run.returncode == 0, run.stderr
    (body,) = run.bodies
    names = [tool.get("name") for tool in body["tools"]]
    assert "exec_command" in names
    assert "apply_patch" not in names
    assert body["reasoning"] == {"summary": "auto"}


def test_a_model_not_served_fails_with_the_servers_reason(
    codex_binary: Path, server: Server, tmp_path: Path
) -> None:
    run = run_oss(codex_binary, server, tmp_path, "ollama", "-m", "llama3:8b")
    assert run.returncode != 0
    assert ("POST", "/api/pull", 200) in run.paths
    assert "'llama3:8b' is not it" in run.stderr
    assert f"-m {MODEL}" in run.stderr
    assert not run.bodies  # nothing was generated


def test_lmstudio_mode_works(codex_binary: Path, server: Server, tmp_path: Path) -> None:
    """LM Studio's mode needs no `lms` binary once /v1/models lists openai/gpt-oss-20b; Codex
    warms the model up with a one-token request first."""
    server.script.push(FINAL)  # the warm-up's one token
    server.script.push(FINAL)
    run = run_oss(codex_binary, server, tmp_path, "lmstudio")
    assert run.returncode == 0, run.stderr
    assert run.answer == ANSWER
    assert [p for p in run.paths if p[0] == "GET"] == [("GET", "/v1/models", 200)] * 2
    warm_up, turn = run.bodies
    assert warm_up == {"model": "openai/gpt-oss-20b", "input": "", "max_output_tokens": 1}
    assert turn["model"] == "openai/gpt-oss-20b"
    assert all(status == 200 for _, _, status in run.paths)
