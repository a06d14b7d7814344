"""The chat page in a real browser: Debian's chromium, headless, driven by selenium.

The server is the real app on the tiny GGUF (uvicorn on 127.0.0.1); forced token scripts choose
what the model writes, and a gate can hold the engine in the middle of a script so the test sees
the page mid-stream (the thinking panel open, no answer yet). Screenshots of the finished chat,
desktop and phone width, go to artifacts/ at the repository root.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from tests.support import chat_page
from tests.support.browser import ARTIFACTS
from tests.support.chat_page import (
    MODEL,
    GatedScript,
    assistants,
    console_errors,
    last_answer,
    open_page,
    record_requests,
    say,
    serve,
    text_of,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow  # a real browser (Debian's chromium)

# the chat page tests' fixtures: the engine and its forced script, the runtime, the browser
script = chat_page.script
engine = chat_page.engine
runtime = chat_page.runtime
browser = chat_page.browser
_release_gate = chat_page._release_gate

REASONING = (
    "The user wants to read a text file in Python. The idiomatic way is a with-block around "
    "open(), with an explicit encoding. Show one short example and the two common methods."
)
ANSWER = (
    "## Reading a file\n\nUse a `with` block so the file is **always closed**:\n\n"
    "```python\nwith open('notes.txt', encoding='utf-8') as f:\n    for line in f:\n"
    "        print(line.rstrip())\n```\n\n"
    "- `read()` returns the whole text\n- `readlines()` returns a list of lines\n\n"
    "| method | returns |\n| --- | ---: |\n| `read()` | str |\n| `readlines()` | list |"
)
CODE = (
    "with open('notes.txt', encoding='utf-8') as f:\n    for line in f:\n"
    "        print(line.rstrip())"
)
FOLLOW_UP = "Or in one line: `Path('notes.txt').read_text(encoding='utf-8')`."


@pytest.fixture(scope="module")
def root(runtime: Runtime) -> Iterator[str]:
    yield from serve(runtime)


def is_open(element: WebElement) -> bool:
    return bool(element.find_element(By.CSS_SELECTOR, ".thinking").get_property("open"))


def test_chat_streams_thinking_then_the_answer_and_keeps_the_conversation(
    browser: WebDriver, root: str, script: GatedScript, engine: LlamaEngine
) -> None:
    open_page(browser, root)
    assert browser.find_element(By.ID, "model-name").text == MODEL
    script.push_gated(
        f"<|channel|>analysis<|message|>{REASONING}",
        f"<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>",
    )
    say(browser, "How do I read a file in Python?")

    # The engine holds after the reasoning: the panel is open and full, no answer yet.
    thinking = last_answer(browser, state="thinking")
    wait_until(lambda: text_of(thinking, ".thinking-text") == REASONING)
    assert is_open(thinking)
    assert text_of(thinking, ".thinking-label") == "Thinking…"
    assert text_of(thinking, ".answer") == ""
    assert browser.find_element(By.ID, "stop").is_displayed()

    script.gate.set()
    done = last_answer(browser)
    assert not is_open(done)  # collapsed when the answer started
    assert re.fullmatch(r"Thought for [\d.]+ m?s", text_of(done, ".thinking-label"))
    answer = done.find_element(By.CSS_SELECTOR, ".answer")
    assert answer.find_element(By.TAG_NAME, "h3").text == "Reading a file"  # h1 is the page's
    assert answer.find_element(By.TAG_NAME, "strong").text == "always closed"
    assert [li.text for li in answer.find_elements(By.TAG_NAME, "li")] == [
        "read() returns the whole text",
        "readlines() returns a list of lines",
    ]
    code = answer.find_element(By.CSS_SELECTOR, ".code-block code")
    assert code.get_attribute("textContent") == CODE
    assert "language-python" in str(code.get_attribute("class"))
    assert [td.text for td in answer.find_elements(By.CSS_SELECTOR, "td.align-right")] == [
        "str",
        "list",
    ]
    stats = text_of(done, ".stats")
    assert re.search(r"\d+ tokens \(\d+ thinking\)", stats), stats
    assert re.search(r"[\d.]+ m?s to first token", stats), stats
    assert re.search(r"[\d.]+ tok/s", stats), stats
    assert re.search(r"\d+ of \d+ prompt tokens cached", stats), stats
    assert browser.find_element(By.ID, "send").is_displayed()
    follow_up_sends_the_reasoning_back(browser, script, engine)
    save_screenshots(browser)
    reload_finds_the_conversation(browser, root)


def follow_up_sends_the_reasoning_back(
    browser: WebDriver, script: GatedScript, engine: LlamaEngine
) -> None:
    # A follow-up sends the reasoning back with the answer; the prompt's prefix comes from cache.
    record_requests(browser)
    script.push(
        "<|channel|>analysis<|message|>pathlib has read_text.<|end|><|start|>assistant"
        f"<|channel|>final<|message|>{FOLLOW_UP}<|return|>"
    )
    say(browser, "And with pathlib?")
    second = last_answer(browser, count=2)
    assert text_of(second, ".answer") == FOLLOW_UP.replace("`", "")
    body = browser.execute_script("return window.__bodies[0];")
    assert body["messages"] == [
        {"role": "user", "content": "How do I read a file in Python?"},
        {"role": "assistant", "content": ANSWER, "reasoning": REASONING},
        {"role": "user", "content": "And with pathlib?"},
    ]
    assert body["stream_options"] == {"include_usage": True}
    assert body["reasoning"] == {"effort": "medium"}
    cached = re.search(r"([\d,]+) of [\d,]+ prompt tokens cached", text_of(second, ".stats"))
    assert cached is not None
    assert int(cached.group(1).replace(",", "")) > 0
    wait_until(lambda: engine.load.running == 0)


def reload_finds_the_conversation(browser: WebDriver, root: str) -> None:
    # Reload: the conversation is still there, and can be found in the list.
    open_page(browser, root, fresh=False)
    assert len(assistants(browser)) == 2
    browser.find_element(By.ID, "new-chat").click()
    assert not assistants(browser)
    browser.find_element(By.CSS_SELECTOR, ".conversation").click()
    reloaded = last_answer(browser, count=2)
    assert text_of(reloaded, ".answer") == FOLLOW_UP.replace("`", "")
    first = assistants(browser)[0]
    assert text_of(first, ".thinking-text") == REASONING
    assert not is_open(first)
    assert browser.find_element(By.ID, "chat-title").text == "How do I read a file in Python?"
    assert not console_errors(browser)


def save_screenshots(browser: WebDriver) -> None:
    """The finished chat, the first thinking panel opened, at desktop and phone width."""
    ARTIFACTS.mkdir(exist_ok=True)
    size = browser.get_window_size()
    browser.find_element(By.CSS_SELECTOR, ".thinking summary").click()
    for name, width, height in (("desktop", 1280, 1000), ("mobile", 390, 844)):
        browser.set_window_size(width, height)
        browser.execute_script("document.getElementById('messages').scrollTop = 0;")
        time.sleep(0.5)  # let the layout settle
        path = ARTIFACTS / f"web-ui-{name}.png"
        browser.save_screenshot(str(path))
        print(f"screenshot: {path}")
    browser.set_window_size(size["width"], size["height"])


def test_rename_export_and_delete(
    browser: WebDriver, root: str, script: GatedScript, tmp_path: Path
) -> None:
    open_page(browser, root)
    script.push(
        "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant"
        "<|channel|>final<|message|>Sure.<|return|>"
    )
    say(browser, "Name me")
    last_answer(browser)

    browser.find_element(By.ID, "rename").click()
    field = browser.find_element(By.ID, "dialog-input")
    field.clear()
    field.send_keys("Greetings", Keys.ENTER)
    wait_until(
        lambda: browser.find_element(By.CSS_SELECTOR, ".conversation").text.startswith("Greetings")
    )
    stored = browser.execute_script(
        "return localStorage.getItem('gpt-oss-server.conversations.v1');"
    )
    [conversation] = json.loads(stored)
    assert conversation["title"] == "Greetings"

    exported = tmp_path / "Greetings.json"
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)}
    )
    browser.find_element(By.ID, "export").click()
    wait_until(lambda: exported.exists() and exported.stat().st_size > 0)
    payload = json.loads(exported.read_text())
    assert payload["format"] == "gpt-oss-server.conversation"
    messages = payload["conversation"]["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "Name me"),
        ("assistant", "Sure."),
    ]
    assert messages[1]["reasoning"] == "Short."
    assert messages[1]["stats"]["usage"]["completion_tokens"] > 0

    browser.find_element(By.ID, "delete").click()
    browser.find_element(By.ID, "dialog-ok").click()
    wait_until(lambda: not browser.find_elements(By.CSS_SELECTOR, ".conversation"))
    assert (
        browser.execute_script(
            "return JSON.parse(localStorage.getItem('gpt-oss-server.conversations.v1'));"
        )
        == []
    )
    open_page(browser, root, fresh=False)
    assert not browser.find_elements(By.CSS_SELECTOR, ".conversation")


def test_stop_cancels_the_generation_and_frees_the_sequence(
    browser: WebDriver, root: str, script: GatedScript, engine: LlamaEngine
) -> None:
    open_page(browser, root)
    long_answer = script.push("<|channel|>final<|message|>" + "word " * 12000 + "<|return|>")
    sampled_before = script.sampled
    say(browser, "Talk for a long time.")
    answering = last_answer(browser, state="answering")
    wait_until(lambda: len(text_of(answering, ".answer")) > 100)
    assert engine.load.running == 1
    browser.find_element(By.ID, "stop").click()
    stopped = last_answer(browser, state="stopped")
    wait_until(lambda: engine.load.running == 0)
    assert script.sampled - sampled_before < len(long_answer) // 2
    assert re.fullmatch(r"Stopped after [\d.]+ m?s", text_of(stopped, ".stats"))
    assert browser.find_element(By.ID, "send").is_displayed()
    metrics = httpx.get(f"{root}/metrics").text
    assert re.search(r'gpt_oss_generations_total\{reason="cancelled"\} [1-9]', metrics)
    # The stopped text is kept, and the page goes on working.
    script.push("<|channel|>final<|message|>Still here.<|return|>")
    say(browser, "Are you there?")
    assert text_of(last_answer(browser, count=2), ".answer") == "Still here."


HOSTILE = (
    'Look: <script>window.__pwned = 1</script> and <img src=x onerror="window.__pwned = 2">'
    " and [click me](javascript:window.__pwned=3) and `<b>bold?</b>`\n\n"
    "```html\n<script>alert('x')</script>\n```\n\n<iframe src=\"/\"></iframe>"
)


def test_hostile_output_renders_as_text(browser: WebDriver, root: str, script: GatedScript) -> None:
    open_page(browser, root)
    script.push(
        '<|channel|>analysis<|message|><img src=x onerror="window.__pwned = 4"><|end|>'
        f"<|start|>assistant<|channel|>final<|message|>{HOSTILE}<|return|>"
    )
    say(browser, '<img src=x onerror="window.__pwned = 5"> <script>alert(6)</script>')
    done = last_answer(browser)
    messages = browser.find_element(By.ID, "messages")
    for tag in ("script", "img", "iframe", "b"):
        assert not messages.find_elements(By.TAG_NAME, tag), tag
    assert not messages.find_elements(By.CSS_SELECTOR, "a")  # javascript: is never a link
    answer = text_of(done, ".answer")
    assert "<script>window.__pwned = 1</script>" in answer
    assert '<img src=x onerror="window.__pwned = 2">' in answer
    assert "[click me](javascript:window.__pwned=3)" in answer
    assert text_of(done, ".answer code") == "<b>bold?</b>"
    assert text_of(done, ".thinking-text") == '<img src=x onerror="window.__pwned = 4">'
    user = browser.find_elements(By.CSS_SELECTOR, ".message.user .bubble")[-1]
    assert user.text.startswith("<img src=x")
    time.sleep(0.5)  # an onerror handler would have run by now
    assert browser.execute_script("return window.__pwned;") is None
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def test_server_view_shows_facts_and_live_load(
    browser: WebDriver, root: str, script: GatedScript, engine: LlamaEngine
) -> None:
    open_page(browser, root)
    browser.find_element(By.ID, "toggle-server").click()

    def fact(name: str) -> str:  # read in one step: the view is rebuilt every few seconds
        return str(
            browser.execute_script(
                "const dd = document.querySelector("
                "`#server-facts dd[data-fact='${arguments[0]}']`);"
                "return dd ? dd.textContent : '';",
                name,
            )
        )

    wait_until(lambda: fact("model").startswith(MODEL))
    assert fact("context").startswith("32,768 tokens")
    assert fact("slots-in-use") == "0 of 2"
    assert fact("reasoning-shown") == "raw"
    script.push_gated(
        "<|channel|>analysis<|message|>Hold on",
        "<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
    )
    say(browser, "Busy?")
    wait_until(lambda: fact("slots-in-use") == "1 of 2", timeout=15)  # refreshed by itself
    script.gate.set()
    last_answer(browser)
    wait_until(lambda: fact("slots-in-use") == "0 of 2", timeout=15)
    assert re.fullmatch(r"[\d.]+ tok/s.*", fact("decode"))
    assert re.fullmatch(r"[\d.]+ tok/s.*", fact("prefill"))
    assert browser.find_element(By.ID, "status-dot").get_attribute("data-status") == "ok"
    browser.find_element(By.CSS_SELECTOR, '[data-close="server-panel"]').click()
    assert not browser.find_element(By.ID, "server-panel").is_displayed()


def test_reasoning_hidden_by_the_server_is_not_shown(
    browser: WebDriver, runtime: Runtime, script: GatedScript
) -> None:
    for url in serve(runtime, reasoning_visibility="none"):
        open_page(browser, url)
        script.push(
            "<|channel|>analysis<|message|>Secret thoughts.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Public answer.<|return|>"
        )
        say(browser, "Hi")
        done = last_answer(browser)
        assert text_of(done, ".answer") == "Public answer."
        assert not done.find_element(By.CSS_SELECTOR, ".thinking").is_displayed()
        assert "Secret" not in str(done.get_attribute("textContent"))


def test_summary_visibility_shows_the_summary(
    browser: WebDriver, runtime: Runtime, script: GatedScript
) -> None:
    for url in serve(runtime, reasoning_visibility="summary"):
        open_page(browser, url)
        script.push(
            "<|channel|>analysis<|message|>Raw chain of thought.<|end|><|start|>assistant"
            "<|channel|>final<|message|>The answer.<|return|>"
        )
        script.push("<|channel|>final<|message|>A short summary.<|return|>")  # the summary
        say(browser, "Hi")
        done = last_answer(browser)
        assert text_of(done, ".answer") == "The answer."
        assert text_of(done, ".thinking-text") == "A short summary."
        assert text_of(done, ".thinking-label") == "Reasoning summary"
        assert "Raw chain" not in str(done.get_attribute("textContent"))


def test_api_key_is_asked_once_per_tab(
    browser: WebDriver, runtime: Runtime, script: GatedScript
) -> None:
    for url in serve(runtime, api_key="sekret"):
        browser.get(url)
        browser.execute_script("localStorage.clear(); sessionStorage.clear();")
        browser.get(url)
        dialog = wait_until(
            lambda: browser.find_element(By.ID, "dialog").get_attribute("open") is not None
        )
        assert dialog
        browser.find_element(By.ID, "dialog-input").send_keys("sekret", Keys.ENTER)
        wait_until(lambda: browser.find_element(By.ID, "model-name").text == MODEL)
        script.push("<|channel|>final<|message|>Authorized.<|return|>")
        say(browser, "Hi")
        assert text_of(last_answer(browser), ".answer") == "Authorized."
        open_page(browser, url, fresh=False)  # same tab: the key is kept, no question
        assert browser.find_element(By.ID, "dialog").get_attribute("open") is None
        assert browser.find_element(By.ID, "model-name").text == MODEL
