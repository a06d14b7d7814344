"""While the browser tool reads a 4 MiB page for one conversation, the server goes on serving the
others: another client's stream keeps delivering tokens and /health answers (the page is made
in a worker process, not on the event loop). uvicorn on 127.0.0.1, the tiny model, real HTTP."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.local_http import send, serve_handler
from tests.support.responses import MODEL, served
from tests.support.scripts import answer, browser_call

# The longest pause between two chunks of the other client's stream while the page is read:
# 100 ms on a quiet machine, widened by twice the stream's own longest pause before the browsing
# request began (a loaded machine pauses every stream; a page read on the event loop pauses it
# for seconds).
MAX_GAP_S = 0.1
MAX_HEALTH_S = 0.5  # the longest a /health may take meanwhile


def big_page() -> bytes:
    """Just under 4 MiB of HTML, slow to make text of: paragraphs of words and links."""
    row = "<p>The tide <b>rises</b> twice a day; see <a href='/n{}'>note {}</a> and more.</p>\n"
    parts, size, n = ["<html><head><title>Big</title></head><body>"], 0, 0
    while size < (4 << 20) - 200:
        part = row.format(n, n)
        parts.append(part)
        size += len(part)
        n += 1
    return ("".join(parts) + "</body></html>").encode()


class Site:
    """Serves the big page at /big.html, noting when it was sent, and a small one elsewhere."""

    def __init__(self) -> None:
        self.page = big_page()
        self.sent_at: float | None = None

    @property
    def handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = site.page if self.path == "/big.html" else b"<p>A small page.</p>"
                send(self, 200, "text/html", page)
                if page is site.page:
                    site.sent_at = time.monotonic()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> ForcedScript:
    return ForcedScript(encoding)


@pytest.fixture(scope="module")
def base_url(
    tiny_gguf: Path,
    script: ForcedScript,
    encoding: HarmonyEncoding,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    # one decode thread: the page's worker has the other core of a two-core machine, so a pause
    # measured is the server's, not two decode threads waiting on each other for a core
    engine = LlamaEngine(
        EngineConfig(model_path=str(tiny_gguf), n_ctx=65536, n_threads=1), sampling_hook=script
    )
    runtime = Runtime(engine=engine, encoding=encoding, model_name=MODEL)
    settings = Settings(
        responses_store_path=tmp_path_factory.mktemp("store") / "responses.sqlite3",
        browser_tool=True,
        browser_allow_private=True,  # the page is served on 127.0.0.1
        tool_timeout_s=600,
    )
    try:
        with served(create_app(settings, runtime)) as url:
            yield url
    finally:
        engine.close()


class Timeline:
    """When each chunk of the other stream came, and when the browser call's result came."""

    def __init__(self) -> None:
        self.chunks: list[float] = []
        self.streaming = threading.Event()
        self.page_read = threading.Event()
        self.tool_done: list[float] = []

    def other_stream(self, base_url: str) -> None:
        """A plain answer, streamed until half a second after the page was read."""
        body = {"model": MODEL, "input": "Talk.", "stream": True, "store": False}
        with httpx.stream("POST", f"{base_url}/responses", json=body, timeout=300) as r:
            for _ in r.iter_raw():
                self.chunks.append(time.monotonic())
                if len(self.chunks) == 20:
                    self.streaming.set()
                if self.page_read.is_set() and self.chunks[-1] > self.tool_done[0] + 0.5:
                    break  # leaves: the server stops this generation

    def browsing(self, base_url: str) -> None:
        """A response with the browser tool, streamed; notes when the call completed."""
        body = {
            "model": MODEL,
            "input": "Read the page.",
            "tools": [{"type": "web_search"}],
            "stream": True,
            "store": False,
        }
        with httpx.stream("POST", f"{base_url}/responses", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    if event["type"] == "response.web_search_call.completed":
                        self.tool_done.append(time.monotonic())
                        self.page_read.set()


def test_a_big_page_stalls_neither_another_stream_nor_health(
    base_url: str, script: ForcedScript
) -> None:
    site, seen = Site(), Timeline()
    with serve_handler(site.handler) as root:
        # a first browser call starts the page workers (a server's first call pays for that)
        script.push(browser_call("open", {"id": f"{root}/small.html"}))
        script.push(answer("Read it."))
        warm = {"model": MODEL, "input": "Read.", "tools": [{"type": "web_search"}]}
        assert httpx.post(f"{base_url}/responses", json=warm, timeout=300).is_success

        # the other client's stream, queued first: an answer longer than the page takes to read
        script.push(answer("word " * 30_000))
        script.push(browser_call("open", {"id": f"{root}/big.html"}))
        script.push(answer("Read it."))
        other = threading.Thread(target=seen.other_stream, args=(base_url,))
        other.start()
        assert seen.streaming.wait(60), "the other stream did not start"
        browser = threading.Thread(target=seen.browsing, args=(base_url,))
        browsing_from = time.monotonic()
        browser.start()
        health: list[tuple[float, float]] = []  # (asked at, took)
        with httpx.Client(base_url=base_url.removesuffix("/v1"), timeout=300) as poller:
            while browser.is_alive() and not seen.page_read.is_set():
                asked = time.monotonic()
                assert poller.get("/health").is_success
                health.append((asked, time.monotonic() - asked))
                time.sleep(0.05)
        browser.join(300)
        other.join(300)

    assert site.sent_at is not None, "the page was never asked for"
    assert seen.tool_done, "the browser call did not complete"
    sent, done, chunks = site.sent_at, seen.tool_done[0], seen.chunks
    assert chunks[-1] > done, "the other stream ended before the page was read"
    # from the page's last byte sent to the call's result: reading, making text, the view
    gaps = [b - a for a, b in itertools.pairwise(chunks) if sent <= b <= done]
    assert gaps, "no chunk of the other stream came while the page was read"
    before = [b - a for a, b in itertools.pairwise(chunks) if b < browsing_from]
    bound = MAX_GAP_S + 2 * max(before)
    assert max(gaps) < bound, (
        f"the other stream paused {max(gaps):.3f} s while the page was read ({done - sent:.2f} s);"
        f" bound {bound:.3f} s, its longest pause before {max(before):.3f} s"
    )
    polled = [took for asked, took in health if sent <= asked <= done]
    assert polled, "/health was not asked while the page was read"
    assert max(polled) < MAX_HEALTH_S, f"/health took {max(polled):.3f} s"
