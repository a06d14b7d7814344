"""Request-side helpers shared by the Chat Completions and Responses adapters."""

from __future__ import annotations

import time
import uuid
from typing import Any

from server.errors import InvalidRequest
from server.events import Timings, Usage
from server.transcript import ReasoningEffort

_EFFORTS: dict[str, ReasoningEffort] = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def clamp_effort(value: str | None, param: str) -> ReasoningEffort | None:
    """Map an OpenAI/OpenRouter effort onto harmony's low | medium | high."""
    if value is None:
        return None
    effort = _EFFORTS.get(value.lower())
    if effort is None:
        raise InvalidRequest(
            f"unknown reasoning effort {value!r}; use one of {', '.join(_EFFORTS)}", param=param
        )
    return effort


def effort_for_budget(max_tokens: int) -> ReasoningEffort:
    """The effort whose typical reasoning length fits a reasoning token budget."""
    if max_tokens < 2048:
        return "low"
    return "medium" if max_tokens < 8192 else "high"


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def timings_out(timings: Timings, usage: Usage) -> dict[str, float]:
    """llama-server style timings, so existing benchmark tooling can read them."""
    return {
        "cache_n": usage.cached_tokens,
        "prompt_n": timings.evaluated_tokens,
        "prompt_ms": round(timings.prefill_s * 1000, 3),
        "prompt_per_second": round(timings.prefill_tokens_per_s, 3),
        "predicted_n": timings.completion_tokens,
        "predicted_ms": round(timings.decode_s * 1000, 3),
        "predicted_per_second": round(timings.decode_tokens_per_s, 3),
        "ttft_ms": round(timings.ttft_s * 1000, 3),
        "queue_ms": round(timings.queue_s * 1000, 3),
    }


def text_of_parts(parts: list[Any], allowed: tuple[str, ...], param: str) -> str:
    """Join the text of content parts; anything but text is refused (gpt-oss reads text only)."""
    texts = []
    for part in parts:
        if part.type not in allowed:
            raise InvalidRequest(
                f"content part type {part.type!r} is not supported: gpt-oss reads text only",
                param=param,
            )
        texts.append(part.text or "")
    return "\n".join(texts)
