"""gpt-oss's built-in python and browser tools run by the server inside one /v1/responses
response, on the real tiny engine.

The python tool runs in its real bubblewrap sandbox; the browser reads pages and a
SearXNG-shaped JSON endpoint served on 127.0.0.1 (`browser_allow_private`, for this test only);
the model's calls are forced scripts written as gpt-oss writes them (python from the analysis
channel); every stream passes the grammar checker, which validates each event against the
openai SDK's types.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.harmony.render import tool_message_tokens
from server.ops.runtime import Runtime
from server.tools.python.sandbox import SandboxUnavailable, configure
from tests.support.local_site import serve_site
from tests.support.responses import MODEL, create, responses_client, stream
from tests.support.scripts import answer, browser_call, python_call, reasoning

PAGE = (
    "<html><head><title>Tides of the Moon</title></head><body><h1>Tides</h1>"
    "<p>The tide rises twice a day, pulled by the Moon.</p></body></html>"
)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """A page and a SearXNG-compatible JSON search endpoint on 127.0.0.1."""
    result = {"title": "Tides of the Moon", "url": "/tides.html"}
    result["content"] = "Why the tide rises twice a day."
    with serve_site({"/tides.html": ("text/html; charset=utf-8", PAGE)}, [result]) as root:
        yield root


@pytest.fixture(scope="module")
def sandbox_ok() -> None:
    try:
        configure()
    except SandboxUnavailable as exc:
        if os.environ.get("GPT_OSS_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{exc} (GPT_OSS_REQUIRE_SANDBOX=1)")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def client(
    runtime: Runtime, tmp_path_factory: pytest.TempPathFactory, site: str, sandbox_ok: None
) -> Iterator[TestClient]:
    with responses_client(
        runtime,
        tmp_path_factory.mktemp("store"),
        python_tool=True,
        python_tool_timeout_s=20,
        browser_tool=True,
        browser_search_url=f"{site}/search",
        browser_allow_private=True,
        tool_timeout_s=60,
    ) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def plain(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An app whose operator turned neither tool on."""
    with responses_client(runtime, tmp_path_factory.mktemp("plain")) as test_client:
        yield test_client


def by_type(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item["type"] == kind]


def test_python_runs_in_the_sandbox_keeps_state_and_the_rounds_reuse_the_kv_cache(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    first = forced.push(reasoning("Compute it.") + python_call("x = 6 * 7\nprint(x)"))
    second = forced.push(python_call("x + 1"))
    forced.push(answer("42, then 43."))
    n_prompts = len(forced.prompts)
    checked = stream(
        client,
        input="What is 6 * 7?",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
    )
    kinds = [item["type"] for item in checked.items]
    assert kinds == ["reasoning", "code_interpreter_call", "code_interpreter_call", "message"]
    one, two = by_type(checked.items, "code_interpreter_call")
    assert one["code"] == "x = 6 * 7\nprint(x)"
    assert one["outputs"] == [{"type": "logs", "logs": "42\n"}]
    assert two["outputs"] == [{"type": "logs", "logs": "43\n"}]  # the kernel kept `x`
    assert one["status"] == two["status"] == "completed"
    assert one["container_id"].startswith("cntr_")
    assert one["container_id"] == two["container_id"]
    types = checked.types()
    assert (
        types.index("response.code_interpreter_call.in_progress")
        < types.index("response.code_interpreter_call_code.done")
        < types.index("response.code_interpreter_call.interpreting")
        < types.index("response.code_interpreter_call.completed")
    )
    # three engine generations in one response; each later prompt is the one before, what was
    # sampled, python's result on the call's channel (analysis) and `<|start|>assistant`
    assert len(forced.prompts) == n_prompts + 3
    p1, p2, p3 = forced.prompts[-3:]
    start = encoding.encode("<|start|>assistant", allowed_special="all")
    result1 = tool_message_tokens(encoding, "python", "42\n", "analysis")
    result2 = tool_message_tokens(encoding, "python", "43\n", "analysis")
    assert p2 == [*p1, *first, *result1, *start]
    assert p3 == [*p2, *second, *result2, *start]
    head = encoding.decode_utf8(p1)
    assert "## python" in head
    assert "Internet access for this session is disabled" in head
    assert "## browser" not in head  # only the tool the request asked for
    usage = checked.response.usage
    assert usage is not None
    assert usage.input_tokens == len(p1) + len(p2) + len(p3)
    # the later rounds evaluated only what was new, not the whole prompt again
    evaluated = usage.input_tokens - usage.input_tokens_details.cached_tokens
    new = 2 + len(result1) + len(result2) + 2 * len(start)
    assert evaluated <= len(p1) + new


def test_the_apis_python_calls_run_inside_the_sandbox(
    client: TestClient, forced: ForcedScript
) -> None:
    code = (
        "import os, socket\n"
        "print(socket.gethostname(), os.getuid(), os.getcwd())\n"
        "print(sorted(os.listdir('/mnt')), os.path.exists('/home'), os.path.exists('/root'))"
    )
    forced.push(python_call(code))
    forced.push(answer("Inside."))
    body = create(
        client,
        input="Where do you run?",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
    )
    logs = by_type(body["output"], "code_interpreter_call")[0]["outputs"][0]["logs"]
    # the sandbox's hostname, user and directory, not the server's; no host directories
    assert logs == "sandbox 1000 /mnt/data\n['.saved', 'data'] False False\n"


def test_the_kernel_lives_for_the_conversation_across_stored_responses(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    tools = [{"type": "code_interpreter", "container": {"type": "auto"}}]
    forced.push(python_call("secret = 'kept'"))
    forced.push(answer("Stored."))
    body = create(client, input="Remember it", tools=tools, store=True)
    forced.push(python_call("print(secret)"))
    forced.push(answer("It was kept."))
    later = create(client, input="Show it", tools=tools, previous_response_id=body["id"])
    call = by_type(later["output"], "code_interpreter_call")[0]
    assert call["outputs"] == [{"type": "logs", "logs": "kept\n"}]
    assert (
        call["container_id"] == by_type(body["output"], "code_interpreter_call")[0]["container_id"]
    )
    # the stored result replays on the channel it was given (analysis)
    replayed = encoding.decode_utf8(forced.prompts[-2])
    assert "<|start|>python to=assistant<|channel|>analysis<|message|>" in replayed
    # another conversation has its own kernel
    forced.push(python_call("print(secret)"))
    forced.push(answer("No."))
    other = create(client, input="Show it", tools=tools)
    logs = by_type(other["output"], "code_interpreter_call")[0]["outputs"][0]["logs"]
    assert "NameError" in logs


def test_web_search_searches_and_opens_pages_served_locally(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding, site: str
) -> None:
    forced.push(reasoning("Search it.") + browser_call("search", {"query": "tides"}))
    forced.push(browser_call("open", {"id": 0}))
    forced.push(browser_call("find", {"pattern": "twice"}))
    forced.push(answer("Twice a day."))
    checked = stream(client, input="How often is the tide high?", tools=[{"type": "web_search"}])
    calls = by_type(checked.items, "web_search_call")
    assert [c["status"] for c in calls] == ["completed"] * 3
    search, opened, found = (c["action"] for c in calls)
    assert search["type"] == "search"
    assert search["query"] == "tides"
    assert search["sources"] == [{"type": "url", "url": f"{site}/tides.html"}]
    assert opened == {"type": "open_page", "url": f"{site}/tides.html"}
    assert found["type"] == "find_in_page"
    assert found["pattern"] == "twice"
    assert by_type(checked.items, "message")[0]["content"][0]["text"] == "Twice a day."
    types = checked.types()
    assert types.count("response.web_search_call.searching") == 3
    assert types.count("response.web_search_call.completed") == 3
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "## browser" in prompt
    assert "namespace browser" in prompt
    assert "<|start|>browser.search to=assistant<|channel|>analysis<|message|>" in prompt
    assert "The tide rises twice a day, pulled by the Moon." in prompt  # the page, read


def test_a_browser_error_is_a_failed_item_and_the_response_goes_on(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(browser_call("open", {"id": 3}))  # no page is open yet
    forced.push(answer("Nothing."))
    checked = stream(client, input="Open it", tools=[{"type": "web_search_preview"}])
    call = by_type(checked.items, "web_search_call")[0]
    assert call["status"] == "failed"
    assert "response.web_search_call.completed" not in checked.types()
    assert checked.response.status == "completed"
    assert "No pages to access!" in encoding.decode_utf8(forced.prompts[-1])


@pytest.mark.parametrize(
    ("tool", "flag"),
    [
        ({"type": "code_interpreter", "container": {"type": "auto"}}, "--python-tool"),
        ({"type": "web_search"}, "--browser-tool"),
        ({"type": "web_search_preview"}, "--browser-tool"),
    ],
)
def test_a_tool_the_operator_did_not_enable_is_a_clear_400(
    plain: TestClient, tool: dict[str, Any], flag: str
) -> None:
    response = plain.post(
        "/v1/responses",
        json={"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f"}, tool]},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "tools[1].type"
    assert tool["type"] in error["message"]
    assert flag in error["message"]
    assert plain.get("/health").status_code == 200  # the server keeps running


def test_codex_s_offline_web_search_is_accepted_and_not_offered(
    plain: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(answer("ok"))
    body = create(plain, input="hi", tools=[{"type": "web_search", "external_web_access": False}])
    assert body["output"][-1]["content"][0]["text"] == "ok"
    assert "browser" not in encoding.decode_utf8(forced.prompts[-1])
