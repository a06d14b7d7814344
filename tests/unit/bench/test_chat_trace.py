"""The HTTP path's decode window: from the first token's arrival to the finish chunk."""

from __future__ import annotations

from typing import Any

import pytest

from server.bench.http_path import ChatTrace

TIMINGS = {"ttft_ms": 5.0, "predicted_per_second": 900.0}
USAGE = {"completion_tokens": 9, "prompt_tokens": 40}


def trace(first_chunk: float, first_visible: float, finished: float) -> ChatTrace:
    events: list[tuple[float, dict[str, Any]]] = [
        (first_chunk, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
        (first_visible, {"choices": [{"delta": {"content": "Hi"}}]}),
        (finished, {"choices": [{"delta": {}, "finish_reason": "length"}]}),
        (finished, {"choices": [], "usage": USAGE, "timings": TIMINGS}),
    ]
    chat = ChatTrace(sent=0.0)
    for arrived, event in events:
        chat.observe(arrived, event)
    return chat


def test_window_starts_at_first_chunk_plus_server_ttft() -> None:
    # role chunk at 1 ms, first token 5 ms later, finish 8 tokens after it (8 ms)
    decode = trace(0.001, 0.007, 0.014).decode()
    assert decode["tokens_per_s"] == pytest.approx(8 / 0.008)


def test_a_late_first_chunk_does_not_push_the_window_past_the_tokens() -> None:
    """The role chunk left 12 ms after the request came in (the handler's delay), while the
    server's ttft (5 ms) counts from the request: first_chunk + ttft (17 ms) falls after the
    first text (13 ms) and the finish (16 ms). The window starts at the first text instead:
    positive, where it measured 0 tokens/s before."""
    decode = trace(0.012, 0.013, 0.016).decode()
    assert decode["tokens_per_s"] == pytest.approx(8 / 0.003)
