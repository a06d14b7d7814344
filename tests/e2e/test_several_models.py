"""Several models from one server, on the real engine: two tiny models of different shapes
(the synthetic `tiny` and `tiny-wide` presets) under a memory budget that holds one of them.

Each model is listed under its names (OpenAI's, Anthropic's and Ollama's lists); a request's
`model` picks one; a name none answers to is a 404 in each API's own shape, through the real
SDKs; a request for the model not loaded swaps it in (the other, idle, unloaded first), and a
stream that waits for that load says so; requests for both at once are all answered while the
two are never loaded together; a model whose file went bad fails its load and the other goes on
serving; per-model settings come from the config file; metrics carry the model; the terminal
chat picks one by name; `serve --model A --model B` as a real process.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from devkit.models import cached_gguf
from devkit.serving import served, server_process
from server.app import create_app
from server.ops.chat.remote import ChatConnectError, RemoteChat
from server.ops.settings import Settings
from server.ops.startup import engine_config, memory_estimate

N_CTX = 1024
BETA_N_CTX = 2048  # beta's own context, from its [models.beta] table
GIB = 1024**3
START_S = 180.0  # the first model loaded and both checked, on a busy machine
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}


@pytest.fixture(scope="module")
def sources() -> tuple[Path, Path]:
    return cached_gguf("tiny"), cached_gguf("tiny-wide")


def copies(sources: tuple[Path, Path], directory: Path) -> tuple[Path, Path]:
    """The two models as alpha.gguf and beta.gguf (their ids: the file names' stems)."""
    alpha, beta = directory / "alpha.gguf", directory / "beta.gguf"
    shutil.copyfile(sources[0], alpha)
    shutil.copyfile(sources[1], beta)
    return alpha, beta


def settings_for(alpha: Path, beta: Path, directory: Path) -> Settings:
    """Both models, a budget that holds either alone but not both, beta's own settings."""
    config = directory / "server.toml"
    config.write_text(
        f'[models.beta]\nn_ctx = {BETA_N_CTX}\nmodel_aliases = ["beta-latest"]\n', "utf-8"
    )
    base = Settings(
        config=config,
        model=(str(alpha), str(beta)),
        n_ctx=N_CTX,
        n_slots=2,
        n_threads=2,
        prompt_cache=False,
        cache_dir=directory / "cache",
        responses_store_path=directory / "state" / "responses.sqlite3",
    )
    costs = [
        memory_estimate(engine_config(base, alpha)),
        memory_estimate(engine_config(base.for_model(base.model_options("beta")), beta)),
    ]
    budget = max(costs) + min(costs) // 2  # either fits, both do not
    return base.model_copy(update={"models_memory_gb": budget / GIB})


@pytest.fixture(scope="module")
def server(sources: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("several")
    alpha, beta = copies(sources, directory)
    with served(create_app(settings_for(alpha, beta, directory)), start_s=START_S) as url:
        yield url


def facts(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/server", timeout=30)
    assert response.status_code == 200
    return dict(response.json())


def states(url: str) -> dict[str, str]:
    return {m["id"]: m["model_state"] for m in facts(url)["models"]}


def chat(url: str, model: str, **extra: Any) -> httpx.Response:
    body = {**CHAT, "model": model, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_every_model_is_listed_under_its_names(server: str) -> None:
    alpha = ["alpha", "gpt-oss:20b", "openai/gpt-oss-20b"]  # a file's stem, its size's names
    beta = ["beta", "beta-latest"]  # the size's names are alpha's already; its own alias
    listed = httpx.get(f"{server}/v1/models").json()["data"]
    assert [m["id"] for m in listed] == alpha + beta
    context = {m["id"]: m["context_length"] for m in listed}
    assert (context["alpha"], context["beta"]) == (N_CTX, BETA_N_CTX)
    assert {m["meta"].get("alias_of") for m in listed if m["id"] == "beta-latest"} == {"beta"}

    claude = anthropic.Anthropic(base_url=server, api_key="unused")
    page = claude.models.list()
    assert [m.id for m in page.data] == alpha + beta
    assert all(m.type == "model" for m in page.data)
    assert claude.models.retrieve("beta-latest").id == "beta-latest"

    tags = httpx.get(f"{server}/api/tags").json()["models"]
    assert [t["name"] for t in tags] == alpha + beta
    one = openai.OpenAI(base_url=f"{server}/v1", api_key="unused").models.retrieve(
        "openai/gpt-oss-20b"
    )
    assert one.id == "openai/gpt-oss-20b"


def test_an_unknown_name_is_each_apis_not_found(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as chat_error:
        client.chat.completions.create(
            model="gpt-5", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    with pytest.raises(openai.NotFoundError) as responses_error:
        client.responses.create(model="gpt-5", input="hi", max_output_tokens=16)
    for error in (chat_error.value, responses_error.value):
        assert error.code == "model_not_found"
        assert error.param == "model"
        assert "gpt-5" in error.message
        assert "alpha" in error.message
        assert "beta" in error.message
    claude = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as messages_error:
        claude.messages.create(
            model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    body = messages_error.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "claude-sonnet-4-5" in body["error"]["message"]
    assert "beta" in body["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")


def test_a_request_swaps_its_model_in_and_a_waiting_stream_says_so(server: str) -> None:
    assert states(server) == {"alpha": "loaded", "beta": "unloaded"}  # the first, at start
    body = {**CHAT, "model": "beta-latest", "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as stream:
        lines = [line for line in stream.iter_lines() if line]
    assert lines[0] == ": loading model beta; this request waits for it"
    assert lines[-1] == "data: [DONE]"
    assert '"model":"beta-latest"' in lines[1]
    assert states(server) == {"alpha": "unloaded", "beta": "loaded"}

    answer = chat(server, "gpt-oss:20b")  # alpha by an alias, beta unloaded to make room
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "gpt-oss:20b"
    loaded_s = re.search(
        r'^gpt_oss_model_last_reload_seconds\{model="alpha"\} ([\d.e+-]+)$',
        httpx.get(f"{server}/metrics").text,
        re.M,
    )
    assert loaded_s is not None
    # a non-streamed request's wait, its model's load included, is in its body's timings
    assert answer.json()["timings"]["queue_ms"] >= float(loaded_s.group(1)) * 1000 - 1
    assert states(server) == {"alpha": "loaded", "beta": "unloaded"}
    budget = facts(server)["budget"]
    assert budget["loaded"] == ["alpha"]
    assert budget["peak_bytes"] <= budget["bytes"]

    metrics = httpx.get(f"{server}/metrics").text
    assert 'gpt_oss_model_state{model="alpha",state="loaded"} 1.0' in metrics
    assert 'gpt_oss_model_state{model="beta",state="unloaded"} 1.0' in metrics
    assert 'gpt_oss_model_unloads_total{model="beta"} 1.0' in metrics
    for model in ("alpha", "beta"):
        assert f'gpt_oss_generations_total{{model="{model}",reason=' in metrics


def test_requests_for_both_are_answered_and_never_both_loaded(server: str) -> None:
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(states(server))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            names = ["alpha", "beta", "beta-latest", "gpt-oss:20b"] * 2
            answers = list(pool.map(lambda name: chat(server, name), names))
    finally:
        done.set()
        watcher.join()
    for name, answer in zip(names, answers, strict=True):
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == name
    assert seen
    assert not [s for s in seen if list(s.values()).count("loaded") > 1]
    budget = facts(server)["budget"]
    assert budget["peak_bytes"] <= budget["bytes"]


def test_a_model_that_fails_to_load_leaves_the_other_serving(
    sources: tuple[Path, Path], tmp_path: Path
) -> None:
    alpha, beta = copies(sources, tmp_path)
    with served(create_app(settings_for(alpha, beta, tmp_path)), start_s=START_S) as url:
        with beta.open("r+b") as file:  # damaged since the start: cut short
            file.truncate(beta.stat().st_size // 2)
        failed = chat(url, "beta")  # waited for the load, which failed: 503, not a 500
        assert failed.status_code == 503, failed.text
        assert failed.json()["error"]["code"] == "engine_unavailable"
        assert "Beta could not be loaded" in failed.json()["error"]["message"]
        again = chat(url, "beta")  # refused at once while the load's backoff lasts
        assert again.status_code == 503
        assert again.json()["error"]["code"] == "engine_unavailable"
        for _ in range(2):
            answer = chat(url, "alpha")
            assert answer.status_code == 200, answer.text
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok"
        assert health["models"] == {"alpha": "loaded", "beta": "unloaded"}
        assert facts(url)["budget"]["loaded"] == ["alpha"]


def test_a_model_whose_engine_failed_is_unloaded_and_gives_its_room_back(
    sources: tuple[Path, Path], tmp_path: Path
) -> None:
    """An engine that can no longer generate (an RPC host dropped: ggml's abort hook reports it
    through the engine's `_fail`, as here, and the engine thread waits for good) is unloaded:
    its requests get 503 with the reason, the budget gets its room back so the other model
    loads (it waited for good before), and a request after the backoff loads it again."""
    alpha, beta = copies(sources, tmp_path)
    app = create_app(settings_for(alpha, beta, tmp_path))
    with served(app, start_s=START_S) as url:
        assert chat(url, "alpha").status_code == 200
        residency = app.state.models.runtimes[0].engine
        engine = residency._engine
        engine._fail("ggml-rpc.cpp:560: Remote RPC server crashed or returned malformed response")
        refused = chat(url, "alpha")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "engine_unavailable"
        assert "Remote RPC server crashed" in refused.json()["error"]["message"]
        answer = chat(url, "beta")  # alpha's room is given back
        assert answer.status_code == 200, answer.text
        assert states(url) == {"alpha": "unloaded", "beta": "loaded"}
        health = httpx.get(f"{url}/health").json()
        assert "failed while loaded" in health["error"]
        assert residency.failed_last
        deadline = time.monotonic() + 60
        again = chat(url, "alpha")
        while again.status_code == 503:  # during the backoff (5 s)
            assert time.monotonic() < deadline, again.text
            time.sleep(0.5)
            again = chat(url, "alpha")
        assert again.status_code == 200, again.text
        assert states(url) == {"alpha": "loaded", "beta": "unloaded"}
        assert not residency.failed_last
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_the_terminal_chat_picks_a_model_of_the_server(server: str) -> None:
    async def connect(model: str | None) -> str:
        chat = RemoteChat(server, None, model)
        try:
            return await chat.connect()
        finally:
            await chat.close()

    assert asyncio.run(connect("beta")) == "beta"
    assert asyncio.run(connect(None)) == "alpha"  # the server's first
    with pytest.raises(ChatConnectError, match=r"serves no model named 'gpt-5'.*alpha.*beta"):
        asyncio.run(connect("gpt-5"))


def test_serve_takes_model_repeated(sources: tuple[Path, Path], tmp_path: Path) -> None:
    alpha, beta = copies(sources, tmp_path)
    options = ("--model", str(beta), "--models-memory-gb", "0.5", "--n-ctx", "1024",
               "--n-threads", "2", "--no-prompt-cache", "--log-level", "info")  # fmt: skip
    with server_process(alpha, tmp_path, *options) as proc:
        root = proc.health_url.removesuffix("/health")
        listed = [m["id"] for m in httpx.get(f"{root}/v1/models").json()["data"]]
        assert listed == ["alpha", "gpt-oss:20b", "openai/gpt-oss-20b", "beta"]
        answer = httpx.post(f"{root}/v1/chat/completions", json={**CHAT, "model": "beta"},
                            timeout=120)  # fmt: skip
        assert answer.status_code == 200, answer.text
    log = proc.log_path.read_text()
    assert "2 models, loaded on demand within 0.5 GiB" in log
    assert "also       beta" in log  # the banner names the other model
