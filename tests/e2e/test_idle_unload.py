"""--idle-unload on a real `gpt-oss-server serve` process: the idle model is unloaded (its
memory goes back: the process's RSS drops), /health, /v1/server and /metrics say so, and the
next request loads it again while the requests beyond the 429 bound are still refused; a reload
that fails (the model file gone) is reported and backed off; and in process, the shutdown during
a load held by the test (tests/e2e/test_rpc.py holds one with a stopped RPC host instead)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from openai_harmony import HarmonyEncoding

from devkit.models import TRAINED, cached_gguf
from devkit.serving import server_process
from server.api.models import UNHEALTHY
from server.app import create_app
from server.bench.procs import ServerProcess
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from server.ops.startup import idle_unloading
from tests.support.responses import served

pytestmark = pytest.mark.slow  # a server process on the 160 MB trained model, loaded 3 times

N_CTX = 4096
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}


@pytest.fixture(scope="module")
def model() -> Path:
    return cached_gguf(TRAINED)  # big enough (≈160 MB of weights) to see in the RSS


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One sequence and no waiting room: slots + max waiting = 1 request at a time."""
    options = ("--idle-unload", "1s", "--n-ctx", str(N_CTX), "--n-threads", "2", "--n-slots",
               "1", "--max-waiting", "0", "--log-level", "info")  # fmt: skip
    with server_process(model, tmp_path_factory.mktemp("idle"), *options) as proc:
        yield proc


def base(proc: ServerProcess) -> str:
    return proc.health_url.removesuffix("/health")


def state(proc: ServerProcess) -> str:
    return str(httpx.get(proc.health_url).json()["model_state"])


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def metric(proc: ServerProcess, name: str) -> float:
    for line in httpx.get(f"{base(proc)}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def chat(proc: ServerProcess, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{base(proc)}/v1/chat/completions", json=CHAT, headers=headers, timeout=120)


def rss_while_loaded(proc: ServerProcess) -> int:
    """The server's RSS with the model loaded: read between two reports that it is loaded (an
    unload may begin 1 s after each answer, and only a generation loads it again)."""
    for _ in range(10):
        assert chat(proc).status_code == 200
        before = state(proc)
        rss = psutil.Process(proc.pid).memory_info().rss
        if before == "loaded" and state(proc) == "loaded":
            return rss
    raise AssertionError("the model never stayed loaded long enough to read the RSS")


def freed_by_an_unload(proc: ServerProcess) -> int:
    """The RSS an idle unload gives back: read while loaded, then once unloaded."""
    rss_loaded = rss_while_loaded(proc)
    wait_for(lambda: state(proc) == "unloaded")
    return rss_loaded - psutil.Process(proc.pid).memory_info().rss


# What an unload of the trained model at N_CTX gives back: its weights (the file's size, in
# anonymous buffers without mmap) and its context's KV and compute buffers. Measured over eight
# unloads of one process: 187–249 MB, twice the file's 93 MB; before the freed heap was trimmed,
# 71–93 MB over five, less than the weights whenever a reload had taken them from malloc's heaps.
FREED_FLOOR = 1.5


def test_idle_model_is_unloaded_and_loaded_again_on_demand(
    server: ServerProcess, model: Path
) -> None:
    freed = freed_by_an_unload(server)
    facts = httpx.get(f"{base(server)}/v1/server").json()
    assert facts["model_state"] == "unloaded"
    assert facts["idle_unload_s"] == 1.0
    assert metric(server, 'gpt_oss_model_state{state="unloaded"}') == 1.0
    assert metric(server, "gpt_oss_model_unloads_total") >= 1
    # the model's weights and context are gone from the process (it keeps the vocabulary)
    assert freed > FREED_FLOOR * model.stat().st_size, freed

    # reading the RSS may have taken reloads (an unload 1 s after an answer, on a busy machine)
    reloads = metric(server, "gpt_oss_model_reloads_total")
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(state(server))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(2) as pool:  # two at once, while the model is unloaded
            statuses = sorted(r.status_code for r in pool.map(lambda _: chat(server), range(2)))
    finally:
        done.set()
        watcher.join()
    assert statuses == [200, 429]  # the waiting one holds the only place: the bound holds
    assert "loading" in seen
    assert metric(server, "gpt_oss_model_reloads_total") == reloads + 1
    reload_s = httpx.get(f"{base(server)}/v1/server").json()["last_reload_s"]
    assert reload_s > 0
    log = server.log_path.read_text()
    assert "unloading the model (--idle-unload)" in log
    assert "a request is waiting: loading the model again" in log
    assert "model loaded again in" in log
    # a model loaded again gives all of its memory back again
    assert (freed := freed_by_an_unload(server)) > FREED_FLOOR * model.stat().st_size, freed


def test_first_answer_after_a_reload_counts_the_wait(server: ServerProcess) -> None:
    """The response's timings (and /metrics' queue time) include the load it waited for."""
    wait_for(lambda: state(server) == "unloaded")
    reloads = metric(server, "gpt_oss_model_reloads_total")
    response = chat(server)
    assert response.status_code == 200
    timings = response.json()["timings"]
    reload_s = httpx.get(f"{base(server)}/v1/server").json()["last_reload_s"]
    assert metric(server, "gpt_oss_model_reloads_total") == reloads + 1
    assert timings["ttft_ms"] >= reload_s * 1000 * 0.9


def test_a_failed_reload_is_reported_and_backed_off(tiny_gguf: Path, tmp_path: Path) -> None:
    """The model file goes away while the model is unloaded: the request that waited for the
    load gets the reason; /health answers 503, with the reason only to a request that carries
    the API key (without it, no path and no error text); /v1/server and /metrics count it; the
    requests during the backoff are refused at once (no load each); once the file is back and
    the backoff is over, the next request loads it and /health is 200 again."""
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny_gguf, model)
    key = {"Authorization": "Bearer the-key"}
    options = ("--idle-unload", "1s", "--n-ctx", "1024", "--n-threads", "2",
               "--no-prompt-cache", "--log-level", "info", "--api-key", "the-key")  # fmt: skip
    with server_process(model, tmp_path, *options) as proc:
        wait_for(lambda: state(proc) == "unloaded")
        model.rename(tmp_path / "gone.gguf")
        failed = chat(proc, key)
        assert failed.status_code == 503  # the model cannot be served now, not a server bug
        assert failed.json()["error"]["code"] == "engine_unavailable"
        assert "could not be loaded again" in failed.json()["error"]["message"]
        keyless = httpx.get(proc.health_url)
        assert keyless.status_code == 503
        assert keyless.json() == {"status": "error", "model": keyless.json()["model"],
                                  "model_state": "unloaded", "error": UNHEALTHY}  # fmt: skip
        assert str(tmp_path) not in keyless.text
        wrong = httpx.get(proc.health_url, headers={"Authorization": "Bearer another"})
        assert wrong.json()["error"] == UNHEALTHY
        health = httpx.get(proc.health_url, headers=key)
        assert health.status_code == 503
        assert "could not be loaded again" in health.json()["error"]
        assert "model.gguf" in health.json()["error"]
        facts = httpx.get(f"{base(proc)}/v1/server", headers=key).json()
        assert facts["reload_failures"] == 1
        assert "model.gguf" in facts["reload_error"]
        assert 0 < facts["reload_retry_in_s"] <= 5
        assert metric(proc, "gpt_oss_model_reload_failures_total") == 1
        assert metric(proc, "gpt_oss_model_reload_failed") == 1
        refused = chat(proc, key)  # during the backoff: refused at once, with the reason
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "engine_unavailable"
        assert "could not be loaded again" in refused.json()["error"]["message"]
        assert proc.log_path.read_text().count("a request is waiting: loading the model") == 1
        (tmp_path / "gone.gguf").rename(model)
        retry = f"{base(proc)}/v1/server"
        wait_for(lambda: httpx.get(retry, headers=key).json()["reload_retry_in_s"] == 0)
        assert chat(proc, key).status_code == 200
        assert httpx.get(proc.health_url).status_code == 200
        facts = httpx.get(f"{base(proc)}/v1/server", headers=key).json()
        assert (facts["reloads"], facts["reload_failures"], facts["reload_error"]) == (1, 1, None)
        assert metric(proc, "gpt_oss_model_reload_failed") == 0


def test_shutdown_while_loading_ends_the_waiting_stream_first(
    tiny_gguf: Path, encoding: HarmonyEncoding, tmp_path: Path
) -> None:
    """In process, the load held until the test lets it go: the shutdown ends the stream that
    waits for the load at once (its terminal error event), stops the load (llama.cpp's
    progress callback) and never starts the stream on an engine loaded meanwhile."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2)
    settings = Settings(idle_unload="0.5s", responses_store_path=tmp_path / "store.sqlite3")
    loading, release = threading.Event(), threading.Event()
    opened: list[LlamaEngine] = []

    def open_engine() -> LlamaEngine:
        loading.set()
        release.wait(60)
        engine = LlamaEngine(config, abort=lambda: residency.closing)
        opened.append(engine)
        return engine

    residency = idle_unloading(settings, LlamaEngine(config), open_engine)
    runtime = Runtime(residency, encoding, "tiny", residency=residency)
    events: list[str] = []
    try:
        with served(create_app(settings, runtime)) as url:
            wait_for(lambda: residency.state.value == "unloaded")

            def stream() -> None:
                body = {**CHAT, "stream": True}
                with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as r:
                    events.extend(line for line in r.iter_lines() if line.startswith("data: "))

            client = threading.Thread(target=stream)
            client.start()
            assert loading.wait(30)
            closer = threading.Thread(target=runtime.close)
            closer.start()
            client.join(10)  # the stream ends while the load is still held
            assert not client.is_alive()
            assert events[-1] == "data: [DONE]"
            assert "shutting down" in events[-2]
            release.set()
            closer.join(60)
            assert not closer.is_alive()
    finally:
        release.set()
        runtime.close()
    assert opened == []  # the load was stopped: llama.cpp returned no model
    assert residency.report.loads == 0
