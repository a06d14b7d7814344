"""The chat page's test harness, shared by its browser tests: the real app on the tiny GGUF
behind uvicorn on 127.0.0.1, forced token scripts with a gate that can hold the engine mid-script,
Debian's chromium, and the page's own controls and messages read through selenium."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

from devkit.forced import ForcedScript
from server.app import create_app
from server.engine.base import EngineConfig
from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.browser import chromium, console_log
from tests.support.polling import wait_until
from tests.support.responses import served

MODEL = "gpt-oss-tiny"


class GatedScript(ForcedScript):
    """Forced scripts; one of them may hold the engine at a point until `gate` is set."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        super().__init__(encoding)
        self.gate = threading.Event()
        self.sampled = 0
        self._hold_at: int | None = None

    def push_gated(self, before: str, after: str) -> None:
        """Queue `before + after`; the engine waits for `gate` between the two."""
        first = self.encoding.encode(before, allowed_special="all")
        self.gate.clear()
        self._hold_at = len(first)
        self.push_tokens(first + self.encoding.encode(after, allowed_special="all"))

    def __call__(self, prompt_tokens: Sequence[int]) -> Callable[[int], int] | None:
        chooser = super().__call__(prompt_tokens)
        if chooser is None:
            return None
        hold, self._hold_at = self._hold_at, None
        position = 0

        def choose(sampled: int) -> int:
            nonlocal position
            if position == hold:
                self.gate.wait(timeout=60)
            position += 1
            self.sampled += 1
            return chooser(sampled)

        return choose


@pytest.fixture(scope="module")
def script(encoding: HarmonyEncoding) -> Iterator[GatedScript]:
    script = GatedScript(encoding)
    yield script
    script.gate.set()


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path, script: GatedScript) -> Iterator[LlamaEngine]:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=32768, n_threads=2, n_slots=2)
    engine = LlamaEngine(config, sampling_hook=script)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def runtime(engine: LlamaEngine, encoding: HarmonyEncoding) -> Runtime:
    return Runtime(engine=engine, encoding=encoding, model_name=MODEL)


def serve(runtime: Runtime, **settings: Any) -> Iterator[str]:
    with served(create_app(Settings(**settings), runtime)) as url:
        yield url.removesuffix("/v1")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


@pytest.fixture(autouse=True)
def _release_gate(script: GatedScript) -> Iterator[None]:
    yield
    script.gate.set()
    script.clear()


def open_page(browser: WebDriver, url: str, fresh: bool = True) -> None:
    browser.get(url)
    if fresh:
        browser.execute_script("localStorage.clear(); sessionStorage.clear();")
        browser.get(url)
    wait_until(lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))


def say(browser: WebDriver, text: str) -> None:
    box = browser.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def assistants(browser: WebDriver) -> list[WebElement]:
    return browser.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")


def last_answer(browser: WebDriver, state: str = "done", count: int = 1) -> WebElement:
    """The last assistant message once there are `count` and the last is in `state`."""

    def reached() -> WebElement | None:
        found = assistants(browser)
        if len(found) >= count and found[-1].get_attribute("data-state") == state:
            return found[-1]
        return None

    try:
        return wait_until(reached)
    except AssertionError:
        found = assistants(browser)
        states = [f.get_attribute("data-state") for f in found]
        raise AssertionError(
            f"assistant states {states}, console {console_log(browser)}, "
            f"last {found[-1].get_attribute('textContent') if found else None!r}"
        ) from None


def text_of(element: WebElement, selector: str) -> str:
    return str(element.find_element(By.CSS_SELECTOR, selector).get_attribute("textContent"))


def record_requests(browser: WebDriver) -> None:
    """Keep the bodies the page posts (window.fetch, wrapped in the page)."""
    browser.execute_script(
        "window.__bodies = []; const f = window.fetch;"
        "window.fetch = (url, init) => {"
        "  if (init && init.body) window.__bodies.push(JSON.parse(init.body));"
        "  return f(url, init); };"
    )


def console_errors(browser: WebDriver) -> list[str]:
    return [e["message"] for e in console_log(browser) if e["level"] == "SEVERE"]
