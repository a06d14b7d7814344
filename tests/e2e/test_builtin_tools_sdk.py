"""gpt-oss's python tool run by the server (`code_interpreter`), through the official openai SDK
over real HTTP on 127.0.0.1, the code in the real bubblewrap sandbox."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from openai import APIStatusError, OpenAI
from openai.types.responses import (
    ResponseCodeInterpreterCallCodeDoneEvent,
    ResponseCodeInterpreterCallCompletedEvent,
    ResponseCodeInterpreterCallInProgressEvent,
    ResponseCodeInterpreterCallInterpretingEvent,
    ResponseCodeInterpreterToolCall,
    ResponseCompletedEvent,
)

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from server.tools.python.sandbox import SandboxUnavailable, configure
from tests.support.responses import MODEL, served
from tests.support.scripts import answer, reasoning


@pytest.fixture(scope="module")
def base_url(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        configure()
    except SandboxUnavailable as exc:
        if os.environ.get("GPT_OSS_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{exc} (GPT_OSS_REQUIRE_SANDBOX=1)")
        pytest.skip(str(exc))
    directory = tmp_path_factory.mktemp("builtin")
    settings = Settings(
        responses_store_path=directory / "responses.sqlite3",
        python_tool=True,
        python_tool_timeout_s=20,
        tool_timeout_s=60,
    )
    with served(create_app(settings, runtime)) as base:
        yield base


@pytest.fixture
def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def test_a_streamed_python_run_as_the_sdk_types_it(sdk: OpenAI, forced: ForcedScript) -> None:
    code = "import math\nprint(math.factorial(10))"
    forced.push(
        reasoning("Compute.") + f"<|channel|>analysis to=python code<|message|>{code}<|call|>"
    )
    forced.push(answer("3628800."))
    events = list(
        sdk.responses.create(
            model=MODEL,
            input="10!",
            tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
            stream=True,
        )
    )
    kinds = [type(event) for event in events]
    for expected in (
        ResponseCodeInterpreterCallInProgressEvent,
        ResponseCodeInterpreterCallCodeDoneEvent,
        ResponseCodeInterpreterCallInterpretingEvent,
        ResponseCodeInterpreterCallCompletedEvent,
    ):
        assert expected in kinds, expected
    completed = events[-1]
    assert isinstance(completed, ResponseCompletedEvent)
    call = next(
        item
        for item in completed.response.output
        if isinstance(item, ResponseCodeInterpreterToolCall)
    )
    assert call.code == code
    assert call.status == "completed"
    assert call.outputs is not None
    assert [(o.type, getattr(o, "logs", None)) for o in call.outputs] == [("logs", "3628800\n")]
    assert completed.response.output_text == "3628800."


def test_the_browser_that_is_off_is_refused_in_openais_error_shape(sdk: OpenAI) -> None:
    with pytest.raises(APIStatusError) as refused:
        sdk.responses.create(model=MODEL, input="news?", tools=[{"type": "web_search"}])
    assert refused.value.status_code == 400
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == "tools[0].type"
    assert "--browser-tool" in body["message"]
