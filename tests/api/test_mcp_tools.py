"""MCP servers run by the server inside one /v1/responses response, on the real tiny engine.

The MCP servers are real (tests/support/mcp_server.py, the official `mcp` SDK) over stdio and
streamable HTTP on 127.0.0.1; the model's calls are forced scripts; every stream passes the
grammar checker, which validates each event against the openai SDK's types.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.harmony.render import tool_message_tokens
from server.ops.runtime import Runtime
from server.tools.mcp import SESSIONS_PER_URL
from tests.support.event_grammar import CheckedStream
from tests.support.mcp_server import (
    HUGE_CHARS,
    X_TEST,
    connections_to,
    http_server,
    stdio_servers,
    write_config,
)
from tests.support.responses import MODEL, create, responses_client, stream
from tests.support.scripts import answer, mcp_call, reasoning

MAX_OUTPUT_CHARS = 2000


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with http_server() as url:
        yield write_config(tmp_path_factory.mktemp("mcp"), url)


@pytest.fixture(scope="module")
def client(
    runtime: Runtime, tmp_path_factory: pytest.TempPathFactory, config: Path
) -> Iterator[TestClient]:
    with responses_client(
        runtime,
        tmp_path_factory.mktemp("store"),
        mcp_config=config,
        tool_timeout_s=60,
        tool_max_output_chars=MAX_OUTPUT_CHARS,
        tool_max_calls=2,
    ) as test_client:
        yield test_client


def tool(label: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "require_approval": "never", **fields}


def by_type(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item["type"] == kind]


def test_a_call_runs_inside_the_response_and_the_round_reuses_the_kv_cache(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    first = forced.push(reasoning("Need the sum.") + mcp_call("web", "add", '{"a":2,"b":3}'))
    forced.push(answer("2 + 3 = 5."))
    n_prompts = len(forced.prompts)
    checked = stream(client, input="What is 2 + 3?", tools=[tool("web")])
    listing, _reasoning, call, message = checked.items
    assert listing["type"] == "mcp_list_tools"
    assert listing["server_label"] == "web"
    assert [t["name"] for t in listing["tools"]] == [
        *("add", "count", "fail", "hang", "huge", "huge_error", "pid", "rpc_error", "whoami")
    ]
    assert call["type"] == "mcp_call"
    assert (call["server_label"], call["name"], call["arguments"]) == (
        "web",
        "add",
        '{"a":2,"b":3}',
    )
    assert call["output"] == "5"
    assert call["status"] == "completed"
    assert call.get("error") is None
    assert message["content"][0]["text"] == "2 + 3 = 5."
    types = checked.types()
    assert (
        types.index("response.mcp_call.in_progress")
        < types.index("response.mcp_call_arguments.done")
        < types.index("response.mcp_call.completed")
    )
    # one response, two engine generations: the second prompt is the first, what was sampled,
    # the tool's message and `<|start|>assistant`, exactly
    assert len(forced.prompts) == n_prompts + 2
    before, after = forced.prompts[-2], forced.prompts[-1]
    result = tool_message_tokens(encoding, "web.add", "5")
    start = encoding.encode("<|start|>assistant", allowed_special="all")
    assert after == [*before, *first, *result, *start]
    assert "calc" not in encoding.decode_utf8(after)  # only the named server is offered
    usage = checked.response.usage
    assert usage is not None
    assert usage.input_tokens == len(before) + len(after)
    # the second round evaluated only what was new (the call's last token, the result, the
    # start of the next message), not the whole prompt again
    evaluated = usage.input_tokens - usage.input_tokens_details.cached_tokens
    assert evaluated <= len(before) + 1 + len(result) + len(start)
    assert usage.output_tokens == len(first) + len(
        encoding.encode(answer("2 + 3 = 5."), allowed_special="all")
    )


def test_stdio_server_call_and_stored_continuation(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(mcp_call("calc", "add", '{"a":40,"b":2}'))
    forced.push(answer("42"))
    body = create(client, input="40 + 2?", tools=[tool("calc")], store=True)
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"]
    assert body["output"][1]["output"] == "42"
    # the continuation replays the call and its result; the listing is not shown again
    forced.push(answer("Done."))
    later = create(
        client,
        input="Thanks",
        tools=[tool("calc")],
        previous_response_id=body["id"],
    )
    assert [item["type"] for item in later["output"]] == ["message"]
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "<|start|>calc.add to=assistant<|channel|>commentary<|message|>42<|end|>" in prompt


def failed_call(
    client: TestClient, forced: ForcedScript, name: str, arguments: str
) -> tuple[CheckedStream, dict[str, Any]]:
    """A response whose model calls `web`'s tool `name`, which reports an error; its call item."""
    forced.push(mcp_call("web", name, arguments))
    forced.push(answer("It failed."))
    checked = stream(client, input="Try it", tools=[tool("web")])
    call = by_type(checked.items, "mcp_call")[0]
    assert call["status"] == "failed"
    assert call["error"]["type"] == "mcp_tool_execution_error"
    return checked, call


def test_a_failing_tool_is_an_error_item_and_the_response_goes_on(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    checked, _call = failed_call(client, forced, "fail", '{"reason":"test"}')
    assert "response.mcp_call.failed" in checked.types()
    assert checked.response.status == "completed"
    assert by_type(checked.items, "message")[0]["content"][0]["text"] == "It failed."
    assert "<|start|>web.fail to=assistant" in encoding.decode_utf8(forced.prompts[-1])


def test_a_huge_result_is_cut_with_a_note_to_the_model(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(mcp_call("web", "huge", "{}"))
    forced.push(answer("Long."))
    checked = stream(client, input="Big", tools=[tool("web")])
    output = by_type(checked.items, "mcp_call")[0]["output"]
    assert output.startswith("0123456789")
    assert len(output) < MAX_OUTPUT_CHARS + 200
    assert f"of {HUGE_CHARS} characters omitted" in output
    assert output in encoding.decode_utf8(forced.prompts[-1])


def test_http_headers_from_the_config_reach_the_server(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push(mcp_call("web", "whoami", "{}"))
    forced.push(answer("ok"))
    body = create(client, input="who", tools=[tool("web")])
    assert by_type(body["output"], "mcp_call")[0]["output"] == X_TEST


def test_a_server_that_cannot_list_is_a_failed_listing_not_a_failed_response(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push(answer("No tools."))
    checked = stream(client, input="hi", tools=[tool("broken")])
    listing = checked.items[0]
    assert listing["type"] == "mcp_list_tools"
    assert listing["error"]
    assert "response.mcp_list_tools.failed" in checked.types()
    assert checked.response.status == "completed"


def test_calls_per_response_are_limited(client: TestClient, forced: ForcedScript) -> None:
    # tool_max_calls=2: after the second call the model is steered to answer; a third call
    # (forced past the steering here) is not run, and the response ends with it
    for n in (1, 2, 3):
        forced.push(mcp_call("web", "add", f'{{"a":{n},"b":0}}'))
    checked = stream(client, input="Count", tools=[tool("web")], max_output_tokens=200)
    calls = by_type(checked.items, "mcp_call")
    assert [c["output"] for c in calls] == ["1", "2", None]
    assert calls[2]["status"] == "failed"
    assert "limit of 2 server-run tool calls" in calls[2]["error"]["message"]
    assert checked.response.status == "completed"


def test_allowed_tools_filter_what_is_listed_and_offered(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(answer("ok"))
    body = create(client, input="hi", tools=[tool("web", allowed_tools=["add"])])
    assert [t["name"] for t in body["output"][0]["tools"]] == ["add"]
    prompt = encoding.decode_utf8(forced.prompts[-1])
    assert "type add" in prompt
    assert "type huge" not in prompt


def test_tool_choice_names_an_mcp_tool(client: TestClient, forced: ForcedScript) -> None:
    forced.push(mcp_call("web", "add", '{"a":1,"b":1}'))
    forced.push(answer("2"))
    choice = {"type": "mcp", "server_label": "web", "name": "add"}
    body = create(client, input="1+1", tools=[tool("web")], tool_choice=choice)
    assert by_type(body["output"], "mcp_call")[0]["output"] == "2"
    assert body["tool_choice"] == choice


def test_approval_request_then_approval_response_runs_the_call(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(mcp_call("web", "add", '{"a":5,"b":6}'))
    first = stream(client, input="5+6", tools=[tool("web", require_approval="always")])
    request = first.items[-1]
    assert request["type"] == "mcp_approval_request"
    assert (request["name"], request["arguments"]) == ("add", '{"a":5,"b":6}')
    assert not by_type(first.items, "mcp_call")
    forced.push(answer("11"))
    approval = {
        "type": "mcp_approval_response",
        "approval_request_id": request["id"],
        "approve": True,
    }
    later = stream(
        client,
        input=[approval],
        tools=[tool("web", require_approval="always")],
        previous_response_id=first.response.id,
    )
    call, message = later.items
    assert call["type"] == "mcp_call"
    assert call["output"] == "11"
    assert call["approval_request_id"] == request["id"]
    assert message["content"][0]["text"] == "11"
    assert "<|start|>web.add to=assistant<|channel|>commentary<|message|>11<|end|>" in (
        encoding.decode_utf8(forced.prompts[-1])
    )
    # an approval request is answered once
    again = client.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": [approval],
            "tools": [tool("web")],
            "previous_response_id": later.response.id,
        },
    )
    assert again.status_code == 400, again.text


def test_a_denied_call_is_not_run_and_the_model_is_told(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(mcp_call("web", "add", '{"a":1,"b":2}'))
    first = create(client, input="1+2", tools=[tool("web", require_approval="always")])
    request = first["output"][-1]
    forced.push(answer("Not allowed."))
    denial = {
        "type": "mcp_approval_response",
        "approval_request_id": request["id"],
        "approve": False,
    }
    later = create(client, input=[denial], tools=[tool("web")], previous_response_id=first["id"])
    assert [item["type"] for item in later["output"]] == ["message"]
    assert "did not approve this call" in encoding.decode_utf8(forced.prompts[-1])


@pytest.mark.parametrize(
    ("mcp_tool", "param"),
    [
        ({"type": "mcp", "server_label": "elsewhere"}, "tools[0].server_url"),
        (
            {"type": "mcp", "server_label": "x", "server_url": "http://169.254.169.254/mcp"},
            "tools[0].server_url",
        ),
        (
            {"type": "mcp", "server_label": "web", "server_url": "http://10.0.0.1/mcp"},
            "tools[0].server_url",
        ),
        (
            {"type": "mcp", "server_label": "web", "require_approval": "sometimes"},
            "tools[0].require_approval",
        ),
    ],
)
def test_servers_a_request_may_not_reach_are_refused(
    client: TestClient, mcp_tool: dict[str, Any], param: str
) -> None:
    response = client.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "tools": [mcp_tool]}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_a_hanging_tool_ends_its_call_with_an_error(
    runtime: Runtime,
    tmp_path_factory: pytest.TempPathFactory,
    config: Path,
    forced: ForcedScript,
) -> None:
    with responses_client(
        runtime,
        tmp_path_factory.mktemp("store"),
        mcp_config=config,
        tool_timeout_s=2,
        responses_keepalive_s=0.25,
    ) as short:
        forced.push(mcp_call("web", "hang", "{}"))
        forced.push(answer("Timed out."))
        started = time.monotonic()
        checked = stream(short, input="wait", tools=[tool("web")])
        assert time.monotonic() - started < 30
    call = by_type(checked.items, "mcp_call")[0]
    assert call["status"] == "failed"
    assert "did not answer within 2 s" in call["error"]["message"]
    assert checked.response.status == "completed"
    # while the call ran the stream was not silent: its running event, repeated
    types = checked.types()
    running = types[
        types.index("response.mcp_call_arguments.done") : types.index("response.mcp_call.failed")
    ]
    assert running.count("response.mcp_call.in_progress") >= 2, running
    assert checked.keepalives >= 2


def test_after_the_last_allowed_call_the_model_is_steered_away_from_tools(
    client: TestClient, forced: ForcedScript
) -> None:
    for n in (1, 2):
        forced.push(mcp_call("web", "add", f'{{"a":{n},"b":0}}'))
    # the third round is sampled freely from the random tiny model, under steering
    checked = stream(client, input="Count", tools=[tool("web")], max_output_tokens=120)
    calls = by_type(checked.items, "mcp_call")
    assert [c["output"] for c in calls] == ["1", "2"]
    assert not by_type(checked.items, "function_call")


def test_a_client_that_keeps_the_conversation_sends_the_items_back(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    script = forced.push(mcp_call("web", "add", '{"a":7,"b":8}'))
    forced.push(answer("15"))
    first = create(client, input="7+8", tools=[tool("web")], store=False)
    forced.push(answer("Yes."))
    again = [
        {"role": "user", "content": "7+8"},
        *first["output"],
        {"role": "user", "content": "Sure?"},
    ]
    create(client, input=again, tools=[tool("web")], store=False)
    prompt = forced.prompts[-1]
    text = encoding.decode_utf8(prompt)
    assert "<|start|>web.add to=assistant<|channel|>commentary<|message|>15<|end|>" in text
    assert any(prompt[i : i + len(script)] == script for i in range(len(prompt)))


def test_a_client_that_keeps_the_conversation_approves_a_call(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    forced.push(mcp_call("web", "add", '{"a":9,"b":1}'))
    first = create(client, input="9+1", tools=[tool("web", require_approval="always")], store=False)
    request = first["output"][-1]
    assert request["type"] == "mcp_approval_request"
    forced.push(answer("10"))
    approval = {
        "type": "mcp_approval_response",
        "approval_request_id": request["id"],
        "approve": True,
    }
    later = create(
        client,
        input=[{"role": "user", "content": "9+1"}, *first["output"], approval],
        tools=[tool("web", require_approval="always")],
        store=False,
    )
    call = by_type(later["output"], "mcp_call")[0]
    assert call["output"] == "10"
    assert "<|start|>web.add to=assistant<|channel|>commentary<|message|>10<|end|>" in (
        encoding.decode_utf8(forced.prompts[-1])
    )


def test_credentials_of_an_mcp_tool_are_not_echoed(
    client: TestClient, forced: ForcedScript
) -> None:
    forced.push(answer("ok"))
    secret = {"Authorization": "Bearer s3cret"}
    body = create(client, input="hi", tools=[tool("web", headers=secret, authorization="s3cret")])
    assert "s3cret" not in json.dumps(body)
    assert body["tools"][0]["server_label"] == "web"


def test_a_stdio_server_is_started_once_for_its_calls(
    client: TestClient, forced: ForcedScript
) -> None:
    pids = []
    for _ in range(2):
        forced.push(mcp_call("calc", "pid", "{}"))
        forced.push(answer("ok"))
        body = create(client, input="pid?", tools=[tool("calc")])
        pids.append(by_type(body["output"], "mcp_call")[0]["output"])
    assert pids[0].isdigit()
    assert pids[0] == pids[1]


def test_requests_with_their_own_descriptions_share_one_stdio_server(
    client: TestClient, forced: ForcedScript
) -> None:
    def pid(**fields: Any) -> str:
        forced.push(mcp_call("calc", "pid", "{}"))
        forced.push(answer("ok"))
        body = create(client, input="pid?", tools=[tool("calc", **fields)])
        return str(by_type(body["output"], "mcp_call")[0]["output"])

    first = pid()
    before = stdio_servers()
    assert before >= 1
    pids = {pid(server_description=f"Calculator number {n} of this test.") for n in range(20)}
    assert stdio_servers() == before
    assert pids == {first}


def test_the_description_a_request_gives_is_what_the_model_reads(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    first, second = "Adds numbers for the first team.", "Adds numbers for the second team."
    for description, other in ((first, second), (second, first)):
        forced.push(answer("ok"))
        create(client, input="hi", tools=[tool("calc", server_description=description)])
        prompt = encoding.decode_utf8(forced.prompts[-1])
        assert description in prompt
        assert other not in prompt
    forced.push(answer("ok"))
    create(client, input="hi", tools=[tool("calc")])
    assert "team." not in encoding.decode_utf8(forced.prompts[-1])


def test_a_json_rpc_error_keeps_the_session_and_the_servers_state(
    client: TestClient, forced: ForcedScript
) -> None:
    def run(name: str) -> dict[str, Any]:
        forced.push(mcp_call("calc", name, "{}"))
        forced.push(answer("ok"))
        body = create(client, input=name, tools=[tool("calc")])
        return by_type(body["output"], "mcp_call")[0]

    pid = run("pid")["output"]
    first = int(run("count")["output"])
    failed = run("rpc_error")
    assert int(run("count")["output"]) == first + 1
    assert run("pid")["output"] == pid
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == -32602  # the server's, passed on
    assert "refused on purpose" in failed["error"]["message"]


def test_a_huge_error_is_cut_like_any_result(
    client: TestClient, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    _checked, call = failed_call(client, forced, "huge_error", "{}")
    error = call["error"]
    (part,) = error["content"]
    assert part["text"].startswith("Error executing tool huge_error: 0123456789")
    assert "characters omitted" in part["text"]
    assert len(json.dumps(error)) < MAX_OUTPUT_CHARS + 500
    assert part["text"] in encoding.decode_utf8(forced.prompts[-1])


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    with http_server(keyed=True) as url:
        yield url


@pytest.fixture(scope="module")
def allowing(
    runtime: Runtime, tmp_path_factory: pytest.TempPathFactory, keyed_url: str
) -> Iterator[TestClient]:
    """A server that lets requests name the keyed MCP server's URL, with their own headers."""
    with responses_client(
        runtime, tmp_path_factory.mktemp("store"), mcp_allowed_urls=(keyed_url,)
    ) as test_client:
        yield test_client


def keyed(url: str, user: str, label: str = "keyed") -> dict[str, Any]:
    return tool(label, server_url=url, headers={"Authorization": f"Bearer {user}"})


def test_a_listing_is_shown_only_to_the_credentials_that_made_it(
    allowing: TestClient, forced: ForcedScript, encoding: HarmonyEncoding, keyed_url: str
) -> None:
    for user in ("alice", "bob", "alice"):
        forced.push(answer("ok"))
        body = create(allowing, input="hi", tools=[keyed(keyed_url, user)])
        listing = by_type(body["output"], "mcp_list_tools")[0]
        assert [t["name"] for t in listing["tools"]] == [f"for_{user}"]
        prompt = encoding.decode_utf8(forced.prompts[-1])
        assert f"type for_{user}" in prompt
        assert {"for_alice", "for_bob"} - {f"for_{user}"} & set(prompt.split()) == set()


def test_sessions_of_an_allowed_url_stay_bounded(
    allowing: TestClient, forced: ForcedScript, keyed_url: str
) -> None:
    # a label of its own each time too: neither the label nor the headers may add sessions
    for n in range(12):
        forced.push(answer("ok"))
        body = create(allowing, input="hi", tools=[keyed(keyed_url, f"user{n}", f"keyed{n}")])
        assert [t["name"] for t in body["output"][0]["tools"]] == [f"for_user{n}"]
        assert connections_to(keyed_url) <= SESSIONS_PER_URL
