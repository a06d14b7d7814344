"""The chat page's switches for the server-run tools, in a real browser (Debian's chromium).

The server is the real app on the tiny GGUF with the browser tool on (pages and a SearXNG-shaped
search endpoint served on 127.0.0.1, reachable through the explicit `browser_allow_private`
setting, for these tests only) and an MCP server over stdio written with the `mcp` SDK
(tests/support/mcp_server.py). Forced scripts make the model call the tools and then answer; the
page sends the turn to /v1/responses and shows each call and its output inline in the thinking
panel, before the answer. A screenshot of the tool view goes to artifacts/web-ui-tools.png.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from server.engine.llama import LlamaEngine
from server.ops.runtime import Runtime
from server.tools.python.sandbox import SandboxUnavailable, configure
from tests.support import chat_page
from tests.support.browser import ARTIFACTS
from tests.support.chat_page import (
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
from tests.support.local_site import serve_site
from tests.support.mcp_server import ROOT
from tests.support.polling import wait_until
from tests.support.scripts import answer, browser_call, mcp_call, python_call, reasoning

pytestmark = pytest.mark.slow  # a real browser (Debian's chromium)

# the chat page tests' fixtures: the engine and its forced script, the runtime, the browser
script = chat_page.script
engine = chat_page.engine
runtime = chat_page.runtime
browser = chat_page.browser
_release_gate = chat_page._release_gate

PAGE = (
    "<html><head><title>Tides of the Moon</title></head><body><h1>Tides</h1>"
    "<p>The tide rises twice a day, pulled by the Moon.</p></body></html>"
)
HOSTILE = '<img src=x onerror="window.__pwned = 7"><script>window.__pwned = 8</script>'
HOSTILE_PATH = '/<img src=x onerror="window.__pwned = 9">'  # a search result's address


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    result = {"title": "Tides of the Moon", "url": "/tides.html"}
    result["content"] = "Why the tide rises twice a day."
    hostile = {"title": HOSTILE, "url": HOSTILE_PATH, "content": HOSTILE}
    with serve_site({"/tides.html": ("text/html; charset=utf-8", PAGE)}, [result, hostile]) as root:
        yield root


@pytest.fixture(scope="module")
def mcp_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One MCP server over stdio, `calc` (its tools: add, fail, hang, huge, pid, whoami)."""
    stdio = {
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_server", "stdio"],
        "env": {"PYTHONPATH": str(ROOT)},
        "cwd": str(ROOT),
    }
    path = tmp_path_factory.mktemp("mcp") / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"calc": stdio}}))
    return path


@pytest.fixture(scope="module")
def tools_root(runtime: Runtime, site: str, mcp_config: Path) -> Iterator[str]:
    """A server with the browser tool and an MCP server on (the python tool off)."""
    yield from serve(
        runtime,
        browser_tool=True,
        browser_search_url=f"{site}/search",
        browser_allow_private=True,
        mcp_config=mcp_config,
        tool_timeout_s=60,
    )


def switches(browser: WebDriver) -> dict[str, str]:
    return {
        str(b.get_attribute("data-tool")): str(b.get_attribute("aria-pressed"))
        for b in browser.find_elements(By.CSS_SELECTOR, "#tools .tool-switch")
    }


def switch(browser: WebDriver, key: str) -> None:
    browser.find_element(By.CSS_SELECTOR, f'#tools .tool-switch[data-tool="{key}"]').click()


def watch_tool_calls(browser: WebDriver) -> None:
    """Record, in the page, what the answer held when each tool call's output appeared."""
    browser.execute_script(
        "window.__seen = [];"
        "new MutationObserver(() => {"
        "  for (const call of document.querySelectorAll('.tool-call')) {"
        "    const out = call.querySelector('.tool-output, .tool-error:not([hidden])');"
        "    if (call.dataset.seen || call.dataset.status === 'in_progress') continue;"
        "    call.dataset.seen = '1';"
        "    const answer = call.closest('.message').querySelector('.answer');"
        "    window.__seen.push({status: call.dataset.status, answer: answer.textContent,"
        "      output: out ? out.textContent : ''});"
        "  }"
        "}).observe(document.getElementById('messages'),"
        "  {subtree: true, childList: true, attributes: true, characterData: true});"
    )


def tool_calls(message: WebElement) -> list[dict[str, str]]:
    def part(call: WebElement, name: str) -> str:
        return str(call.find_element(By.CSS_SELECTOR, f".tool-{name}").get_attribute("textContent"))

    return [
        {
            "type": str(call.get_attribute("data-type")),
            "status": str(call.get_attribute("data-status")),
            **{name: part(call, name) for name in ("name", "input", "output", "error")},
        }
        for call in message.find_elements(By.CSS_SELECTOR, ".thinking-text .tool-call")
    ]


def test_switches_only_for_the_tools_the_server_enabled(
    browser: WebDriver, runtime: Runtime, tools_root: str
) -> None:
    for url in serve(runtime):  # no tool on: no switch, the page as before
        open_page(browser, url)
        assert switches(browser) == {}
        assert not browser.find_element(By.ID, "tools").is_displayed()
    open_page(browser, tools_root)
    assert switches(browser) == {"web_search": "false", "mcp:calc": "false"}  # no python
    switch(browser, "web_search")
    assert switches(browser) == {"web_search": "true", "mcp:calc": "false"}
    open_page(browser, tools_root, fresh=False)  # the choice is kept for the next chat
    assert switches(browser) == {"web_search": "true", "mcp:calc": "false"}


def test_web_search_runs_inline_in_the_thinking_panel_then_the_answer(
    browser: WebDriver, tools_root: str, script: GatedScript, site: str, engine: LlamaEngine
) -> None:
    open_page(browser, tools_root)
    switch(browser, "web_search")
    record_requests(browser)
    watch_tool_calls(browser)
    script.push(reasoning("Search it.") + browser_call("search", {"query": "tides"}))
    script.push(browser_call("open", {"id": 0}))
    script.push(reasoning("The page says twice a day.") + answer("**Twice** a day."))
    say(browser, "How often is the tide high?")
    done = last_answer(browser)

    body = browser.execute_script("return window.__bodies[0];")
    assert body["tools"] == [{"type": "web_search"}]
    assert body["stream"] is True
    assert body["store"] is False
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "How often is the tide high?"}
    ]
    calls = tool_calls(done)
    assert [(c["type"], c["name"], c["status"]) for c in calls] == [
        ("web_search_call", "Web search", "completed"),
        ("web_search_call", "Open page", "completed"),
    ]
    assert calls[0]["input"] == "tides"
    assert calls[0]["output"] == f"{site}/tides.html\n{site}{HOSTILE_PATH}"  # the sources found
    assert calls[1]["input"] == f"{site}/tides.html"
    # reasoning, the calls and the reasoning after them, in order, inside the thinking panel
    parts = done.find_elements(By.CSS_SELECTOR, ".thinking-text > *")
    assert [p.get_attribute("class") for p in parts] == [
        "thinking-part",
        "tool-call",
        "tool-call",
        "thinking-part",
    ]
    assert text_of(done, ".thinking-part") == "Search it."
    assert parts[-1].get_attribute("textContent") == "The page says twice a day."
    assert done.find_element(By.CSS_SELECTOR, ".answer strong").text == "Twice"
    assert text_of(done, ".answer") == "Twice a day."
    # each call's output was on the page while it ran, before the answer began
    seen = browser.execute_script("return window.__seen;")
    assert [(s["status"], s["answer"]) for s in seen] == [("completed", ""), ("completed", "")]
    assert seen[0]["output"].startswith(f"{site}/tides.html")
    stats = text_of(done, ".stats")
    assert re.search(r"[\d,]+ tokens \([\d,]+ thinking\)", stats), stats
    assert re.search(r"[\d,]+ of [\d,]+ prompt tokens cached", stats), stats
    wait_until(lambda: engine.load.running == 0)

    # The thinking panel opens on a click and shows the calls; reload keeps them.
    done.find_element(By.CSS_SELECTOR, ".thinking summary").click()
    assert done.find_element(By.CSS_SELECTOR, ".tool-call .tool-input").is_displayed()
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "web-ui-tools.png"))
    open_page(browser, tools_root, fresh=False)
    assert [c["input"] for c in tool_calls(assistants(browser)[0])] == ["tides", calls[1]["input"]]

    # The switch off: the next turn goes to /v1/chat/completions, the answer sent back as text.
    switch(browser, "web_search")
    record_requests(browser)
    script.push(answer("You are welcome."))
    say(browser, "Thanks")
    assert text_of(last_answer(browser, count=2), ".answer") == "You are welcome."
    body = browser.execute_script("return window.__bodies[0];")
    assert "tools" not in body
    assert body["messages"][1] == {"role": "assistant", "content": "**Twice** a day."}
    assert not console_errors(browser)


def test_mcp_calls_and_hostile_tool_text_render_as_text(
    browser: WebDriver, tools_root: str, script: GatedScript, site: str
) -> None:
    open_page(browser, tools_root)
    switch(browser, "mcp:calc")
    switch(browser, "web_search")
    record_requests(browser)
    arguments = json.dumps({"reason": HOSTILE})
    script.push(mcp_call("calc", "add", '{"a":2,"b":3}'))
    script.push(mcp_call("calc", "fail", arguments))
    script.push(browser_call("search", {"query": HOSTILE}))
    script.push(answer("It failed."))
    say(browser, "Add, then fail")
    done = last_answer(browser)
    body = browser.execute_script("return window.__bodies[0];")
    assert body["tools"] == [  # in the order of the switches
        {"type": "web_search"},
        {"type": "mcp", "server_label": "calc", "require_approval": "never"},
    ]
    added, failed, searched = tool_calls(done)
    assert (added["name"], added["input"], added["output"], added["status"]) == (
        "calc · add",
        '{"a":2,"b":3}',
        "5",
        "completed",
    )
    # the model's arguments, the tool's error and the search's sources, shown as the text they are
    assert (failed["name"], failed["status"]) == ("calc · fail", "failed")
    assert failed["input"] == arguments
    assert failed["error"] == "Error executing tool fail"
    assert searched["input"] == HOSTILE
    assert searched["output"] == f"{site}/tides.html\n{site}{HOSTILE_PATH}"
    messages = browser.find_element(By.ID, "messages")
    for tag in ("script", "img"):
        assert not messages.find_elements(By.TAG_NAME, tag), tag
    time.sleep(0.5)  # an onerror handler would have run by now
    assert browser.execute_script("return window.__pwned;") is None
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert text_of(done, ".answer") == "It failed."


def test_python_code_and_what_it_printed_show_inline(
    browser: WebDriver, runtime: Runtime, script: GatedScript
) -> None:
    try:
        configure()
    except SandboxUnavailable as exc:
        if os.environ.get("GPT_OSS_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{exc} (GPT_OSS_REQUIRE_SANDBOX=1)")
        pytest.skip(str(exc))
    for url in serve(runtime, python_tool=True, python_tool_timeout_s=20, tool_timeout_s=60):
        open_page(browser, url)
        assert switches(browser) == {"code_interpreter": "false"}
        switch(browser, "code_interpreter")
        record_requests(browser)
        script.push(reasoning("Compute it.") + python_call("x = 6 * 7\nprint(x)"))
        script.push(answer("6 * 7 = 42."))
        say(browser, "What is 6 * 7?")
        done = last_answer(browser)
        body = browser.execute_script("return window.__bodies[0];")
        assert body["tools"] == [{"type": "code_interpreter", "container": {"type": "auto"}}]
        [call] = tool_calls(done)
        assert (call["type"], call["name"], call["status"]) == (
            "code_interpreter_call",
            "Python",
            "completed",
        )
        assert call["input"] == "x = 6 * 7\nprint(x)"
        assert call["output"] == "42\n"
        assert text_of(done, ".answer") == "6 * 7 = 42."


def test_stop_aborts_a_response_with_tools(
    browser: WebDriver, tools_root: str, script: GatedScript, engine: LlamaEngine
) -> None:
    open_page(browser, tools_root)
    switch(browser, "web_search")
    script.push(browser_call("search", {"query": "tides"}))
    script.push("<|channel|>final<|message|>" + "word " * 12000 + "<|return|>")
    say(browser, "Search and talk for a long time.")
    answering = last_answer(browser, state="answering")
    wait_until(lambda: len(text_of(answering, ".answer")) > 100)
    assert [c["status"] for c in tool_calls(answering)] == ["completed"]
    browser.find_element(By.ID, "stop").click()
    stopped = last_answer(browser, state="stopped")
    wait_until(lambda: engine.load.running == 0)
    assert re.fullmatch(r"Stopped after [\d.]+ m?s", text_of(stopped, ".stats"))
    assert browser.find_element(By.ID, "send").is_displayed()
    assert re.search(
        r'gpt_oss_generations_total\{reason="cancelled"\} [1-9]',
        httpx.get(f"{tools_root}/metrics").text,
    )

    # Stop while a call runs (an MCP tool that never answers): the call ends "not run".
    open_page(browser, tools_root)
    switch(browser, "mcp:calc")
    script.push(mcp_call("calc", "hang", "{}"))
    script.push(answer("Never reached."))
    say(browser, "Hang")
    waiting = last_answer(browser, state="thinking")
    wait_until(lambda: [c["status"] for c in tool_calls(waiting)] == ["in_progress"])
    assert text_of(waiting, ".tool-status") == "running…"
    browser.find_element(By.ID, "stop").click()
    stopped = last_answer(browser, state="stopped")
    [hung] = tool_calls(stopped)
    assert (hung["name"], hung["status"]) == ("calc · hang", "incomplete")
    assert text_of(stopped, ".tool-status") == "not run"
    script.clear()
    script.push(answer("Still here."))
    switch(browser, "mcp:calc")
    say(browser, "Are you there?")
    assert text_of(last_answer(browser, count=2), ".answer") == "Still here."
