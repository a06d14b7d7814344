"""The official openai SDK's Responses client against the server over real HTTP on 127.0.0.1."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses import (
    FunctionToolParam,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
)

from devkit.forced import ForcedScript
from server.app import create_app
from server.ops.runtime import Runtime
from server.ops.settings import Settings
from tests.support.event_grammar import check_stream
from tests.support.responses import MODEL, served, sse_payloads
from tests.support.scripts import ARITHMETIC, WEATHER_CALL

REASON_THEN_ANSWER = ARITHMETIC
TOOLS: list[FunctionToolParam] = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    }
]


@pytest.fixture(scope="module")
def base_url(runtime: Runtime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server that sends keepalive events after 1 ms without output: the SDK must cope."""
    store = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    settings = Settings(responses_store_path=store, responses_keepalive_s=0.001)
    with served(create_app(settings, runtime)) as url:
        yield url


@pytest.fixture
def sdk(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def test_create_non_streaming(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    response = sdk.responses.create(model=MODEL, input="2+2?", reasoning={"effort": "low"})
    assert response.status == "completed"
    assert response.output_text == "2 + 2 = 4."
    reasoning = response.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.summary == []
    assert reasoning.content is not None
    assert reasoning.content[0].text == "Math."
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    assert sdk.responses.retrieve(response.id).output_text == "2 + 2 = 4."
    sdk.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)


def test_create_streaming_yields_typed_events(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    events = list(sdk.responses.create(model=MODEL, input="2+2?", stream=True))
    checked = check_stream([event.model_dump(mode="json") for event in events])
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert events[-1].response.output_text == "2 + 2 = 4."
    assert [e.delta for e in events if e.type == "response.reasoning_text.delta"] != []
    assert len(checked.items) == 2


def test_stream_helper_accumulates_the_final_response(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    with sdk.responses.stream(model=MODEL, input="2+2?") as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == "2 + 2 = 4."
    assert final.output_text == "2 + 2 = 4."
    assert final.status == "completed"


def test_stream_helper_takes_keepalive_events_in_stride(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    long_input = " ".join(uuid.uuid4().hex for _ in range(150))  # a prompt that takes a while
    with sdk.responses.stream(model=MODEL, input=long_input) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types.count("response.in_progress") > 1
    assert final.output_text == "2 + 2 = 4."


def test_stream_helper_with_a_tool_call_and_its_answer(sdk: OpenAI, forced: ForcedScript) -> None:
    forced.push(WEATHER_CALL)
    with sdk.responses.stream(model=MODEL, input="Weather in Paris?", tools=TOOLS) as stream:
        done = [e.arguments for e in stream if e.type == "response.function_call_arguments.done"]
        first = stream.get_final_response()
    assert done == ['{"city":"Paris"}']
    call = first.output[-1]
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.name, call.arguments) == ("get_weather", '{"city":"Paris"}')
    forced.push("<|channel|>final<|message|>Sunny in Paris.<|return|>")
    second = sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=TOOLS,
    )
    assert second.output_text == "Sunny in Paris."
    assert second.previous_response_id == first.id


def test_raw_sse_has_event_names_and_no_done_marker(base_url: str, forced: ForcedScript) -> None:
    forced.push(REASON_THEN_ANSWER)
    body = {"model": MODEL, "input": "2+2?", "stream": True}
    with httpx.stream("POST", f"{base_url}/responses", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())
    assert "data: [DONE]" not in lines
    checked = check_stream(sse_payloads(iter(lines)))
    assert checked.types()[-1] == "response.completed"


def test_unknown_previous_response_is_a_not_found_error(sdk: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        sdk.responses.create(model=MODEL, input="Hi", previous_response_id="resp_missing")
    assert raised.value.status_code == 404
