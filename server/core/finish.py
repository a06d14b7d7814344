"""How a generation ended: the engine's result -> the `Finished` event every API reads."""

from __future__ import annotations

import dataclasses

from server.contracts.events import Finished, FinishReason
from server.engine.base import EngineResult, StopReason
from server.harmony.tokens import CALL as CALL_TOKEN


def finished_event(result: EngineResult, reasoning_tokens: int, *, stopped: str | None) -> Finished:
    """The generation's last event. `stopped`: the stop string that ended the answer, if one
    did."""
    return Finished(
        reason=FinishReason.STOP if stopped is not None else finish_reason(result),
        usage=dataclasses.replace(result.usage, reasoning_tokens=reasoning_tokens),
        timings=result.timings,
        error=result.error,
        unavailable=result.stop_reason is StopReason.UNAVAILABLE,
        stop_sequence=stopped,
        steering=result.steering,
    )


def finish_reason(result: EngineResult) -> FinishReason:
    if result.stop_reason is StopReason.STOP_TOKEN:
        return FinishReason.TOOL_CALL if result.stop_token == CALL_TOKEN else FinishReason.STOP
    if result.stop_reason in (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL):
        return FinishReason.LENGTH
    if result.stop_reason is StopReason.CANCELLED:
        return FinishReason.CANCELLED
    return FinishReason.ERROR
