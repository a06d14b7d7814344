"""MCP tools run by the server, through the official openai SDK over real HTTP on 127.0.0.1,
with real MCP servers (stdio and streamable HTTP)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseMcpListToolsCompletedEvent,
)
from openai.types.responses.response_output_item import McpCall, McpListTools
from openai.types.responses.tool_param import Mcp

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.mcp_server import http_server, write_config
from tests.support.responses import MODEL, served
from tests.support.scripts import answer, mcp_call


@pytest.fixture(scope="module")
def base_url(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("mcp")
    with http_server() as url:
        config: Path = write_config(directory, url)
        settings = Settings(
            responses_store_path=directory / "responses.sqlite3",
            mcp_config=config,
            tool_timeout_s=30,
        )
        with served(create_app(settings, runtime)) as base:
            yield base


@pytest.fixture
def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def web(label: str = "web") -> Mcp:
    return {"type": "mcp", "server_label": label, "require_approval": "never"}


def test_streamed_mcp_call_as_the_sdk_types_it(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(mcp_call("web", "add", '{"a":20,"b":22}'))
    forced.push(answer("42."))
    events = list(sdk.responses.create(model=MODEL, input="20+22", tools=[web()], stream=True))
    kinds = [type(event) for event in events]
    for expected in (
        ResponseMcpListToolsCompletedEvent,
        ResponseMcpCallInProgressEvent,
        ResponseMcpCallArgumentsDoneEvent,
        ResponseMcpCallCompletedEvent,
    ):
        assert expected in kinds, expected
    completed = events[-1]
    assert isinstance(completed, ResponseCompletedEvent)
    listing, call, _message = completed.response.output
    assert isinstance(listing, McpListTools)
    assert "add" in [tool.name for tool in listing.tools]
    assert isinstance(call, McpCall)
    assert (call.name, call.arguments, call.output, call.error) == (
        "add",
        '{"a":20,"b":22}',
        "42",
        None,
    )
    assert completed.response.output_text == "42."


def test_stdio_server_through_the_sdk(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(mcp_call("calc", "add", '{"a":1,"b":2}'))
    forced.push(answer("3"))
    response = sdk.responses.create(model=MODEL, input="1+2", tools=[web("calc")])
    call = next(item for item in response.output if isinstance(item, McpCall))
    assert call.output == "3"
    assert response.output_text == "3"


def test_a_client_that_leaves_during_a_call_leaves_the_server_serving(
    sdk: OpenAI, forced: ForcedScript
) -> None:
    forced.push(mcp_call("web", "hang", "{}"))
    forced.push(answer("never sent"))  # the response is abandoned before this round
    with sdk.responses.create(model=MODEL, input="wait", tools=[web()], stream=True) as stream:
        for event in stream:
            if isinstance(event, ResponseMcpCallArgumentsDoneEvent):
                break  # the call is running now; the client goes away
    forced.clear()
    forced.push(answer("Still here."))
    started = time.monotonic()
    response = sdk.responses.create(model=MODEL, input="hello")
    assert response.output_text == "Still here."
    assert time.monotonic() - started < 25  # not behind the abandoned call's 30 s
