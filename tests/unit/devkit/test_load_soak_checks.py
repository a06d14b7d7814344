"""The load test's pure parts: the soak's RSS flatness check, and the tool loop's round bodies
in each API's shape (read by the server's own request schemas)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from devkit.load_test.memory import MIB, Sample, curve_report
from devkit.load_test.mix import (
    ENDPOINTS,
    LOOP_MAX_TOKENS,
    LOOP_ROUNDS,
    Endpoint,
    RequestSpec,
    ToolCall,
    endless_requests,
)
from server.api.chat.schemas import ChatCompletionRequest
from server.api.messages.schemas import MessagesRequest
from server.api.responses.schemas import ResponsesRequest


def _curve(mib: list[float], every_s: float = 10.0) -> list[Sample]:
    return [Sample(i * every_s, int(m * MIB), i, 0.0, 0.0) for i, m in enumerate(mib)]


def test_flat_curve_after_a_warmup_jump_passes() -> None:
    samples = _curve([100.0, 150.0, 200.0] + [300.0, 301.0, 300.5] * 4)
    report = curve_report(samples, warmup_s=30.0, tolerance=0.05)
    assert report["flat"] is True
    assert report["samples_after_warmup"] == 12
    assert report["first_third_median_mib"] == pytest.approx(300.25)  # 300, 301, 300.5, 300
    assert abs(report["slope_mib_per_hour"]) < 50


def test_steady_growth_fails_and_has_its_slope() -> None:
    samples = _curve([300.0 + 2.0 * i for i in range(30)], every_s=60.0)  # 2 MiB a minute
    report = curve_report(samples, warmup_s=0.0, tolerance=0.05)
    assert report["flat"] is False
    assert report["ratio"] > 1.05
    assert report["slope_mib_per_hour"] == pytest.approx(120.0)


def test_a_single_spike_does_not_fail() -> None:
    samples = _curve([300.0] * 14 + [400.0] + [300.0] * 3)
    assert curve_report(samples, warmup_s=0.0, tolerance=0.05)["flat"] is True


def test_too_few_samples_after_warmup_is_no_verdict() -> None:
    report = curve_report(_curve([300.0] * 5), warmup_s=35.0, tolerance=0.05)
    assert report["flat"] is None


_SCHEMAS: dict[Endpoint, type[BaseModel]] = {
    "chat": ChatCompletionRequest,
    "responses": ResponsesRequest,
    "messages": MessagesRequest,
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_tool_loop_rounds_in_each_api_shape(endpoint: Endpoint) -> None:
    spec = RequestSpec(7, endpoint, stream=True, tools=True, max_tokens=20, cancel_after=None,
                       rounds=LOOP_ROUNDS)  # fmt: skip
    first = ToolCall("call_a", "get_weather", json.dumps({"city": "Oslo"}))
    second = ToolCall("call_b", "get_weather", json.dumps({"city": "Rome"}))
    bodies = [spec.body(), spec.body([[first]]), spec.body([[first], [second]])]
    for body in bodies:
        _SCHEMAS[endpoint].model_validate(body)
    dumped = [json.dumps(body["tool_choice"]) for body in bodies]
    # index 7: round 0 (odd) forces any tool, round 1 (even) names it, the last lets it answer
    assert dumped[0] in {'"required"', '{"type": "any"}'}
    assert "get_weather" in dumped[1]
    assert "auto" in dumped[2]
    limits = [body.get("max_tokens", body.get("max_output_tokens")) for body in bodies]
    assert limits == [LOOP_MAX_TOKENS, LOOP_MAX_TOKENS, 20]
    text = json.dumps(bodies[2])
    assert "call_a" in text  # both calls and their results go back
    assert "call_b" in text
    assert text.count("temperature_c") == 2


def test_endless_mix_has_every_api_loops_and_cancellations() -> None:
    mix = endless_requests(0, 0.3, 64, start=0, loop_share=0.2)
    specs = [next(mix) for _ in range(300)]
    assert {s.kind for s in specs} == {
        f"{e}/{m}" for e in ("chat", "responses", "messages") for m in ("json", "stream")
    }
    assert {s.endpoint for s in specs if s.loop} == {"chat", "responses", "messages"}
    cancelled = [s for s in specs if s.cancel_after is not None]
    assert cancelled
    assert all(s.stream and not s.loop for s in cancelled)
