"""Completions' emitter: a raw generation's events (server/core/raw.py) -> legacy completion
chunks, streamed or folded into one choice of the body.

Each delta becomes a chunk with its text and, where asked, the legacy logprobs of its tokens
(their `text_offset` counted in characters from where the choice's text starts: after the echoed
prompt, if any). `Finished` becomes the chunk with the finish reason, the usage chunk (where
`stream_options.include_usage` asks), and `[DONE]`; a failed generation ends with an error event
and `[DONE]`, a cancelled one with nothing (nobody listens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from server.api.completions.schemas import CompletionChoice, CompletionUsage
from server.api.logprobs import LegacyLogprobs, TextOffsets, joined, legacy
from server.api.sse import DONE, sse_data
from server.contracts.errors import error_envelope
from server.contracts.events import Finished, FinishReason, GenerationEvent, SegmentDelta
from server.harmony.token_bytes import TokenBytes

CompletionEvent = dict[str, Any] | Literal["[DONE]"]


def encode(event: CompletionEvent) -> bytes:
    return DONE if event == "[DONE]" else sse_data(event)


def failed(event: CompletionEvent) -> bool:
    """Whether `event` is a failed generation's error event."""
    return isinstance(event, dict) and "error" in event


@dataclass(frozen=True)
class Identity:
    """What every chunk of one completion carries."""

    id: str
    created: int
    model: str

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


@dataclass
class CompletionsEmitter:
    """One choice of a completion: its chunks, and what its fold reads."""

    identity: Identity
    index: int
    vocab: TokenBytes
    n_prompt: int
    n_top: int | None = None  # legacy logprobs with this many alternatives; None: none
    include_usage: bool = False
    offset: int = 0  # where the generated text starts in the choice's text (after an echo)
    text: str = ""
    logprobs: list[LegacyLogprobs] = field(default_factory=list)
    finished: Finished | None = None
    _offsets: TextOffsets | None = None

    @property
    def waits_for_summaries(self) -> bool:
        return False

    @property
    def done(self) -> bool:
        return self.finished is not None

    def start(self) -> list[CompletionEvent]:
        return []

    def keepalive(self) -> list[CompletionEvent]:
        return []  # Completions has no keepalive event

    def feed(self, event: GenerationEvent) -> list[CompletionEvent]:
        if self.finished is not None:
            return []
        if isinstance(event, Finished):
            return self._finish(event)
        if not isinstance(event, SegmentDelta):
            return []
        self.text += event.text
        scored = self._scored(event)
        return [self._chunk(event.text, scored, None)]

    def finish_reason(self) -> Literal["stop", "length"]:
        assert self.finished is not None
        if self.finished.reason in (FinishReason.STOP, FinishReason.TOOL_CALL):
            return "stop"
        return "length"

    def usage(self) -> CompletionUsage:
        assert self.finished is not None
        usage = self.finished.usage
        return CompletionUsage(
            prompt_tokens=self.n_prompt,
            completion_tokens=usage.completion_tokens,
            total_tokens=self.n_prompt + usage.completion_tokens,
            prompt_tokens_details={"cached_tokens": usage.cached_tokens},
        )

    def choice(self, prefix: str = "", echoed: LegacyLogprobs | None = None) -> CompletionChoice:
        """The folded choice; `prefix` and `echoed`: the prompt's text and logprobs (echo)."""
        logprobs = None
        if self.n_top is not None:
            logprobs = joined([*([echoed] if echoed is not None else []), *self.logprobs])
        return CompletionChoice(
            index=self.index,
            text=prefix + self.text,
            logprobs=logprobs,
            finish_reason=self.finish_reason(),
        )

    def _scored(self, delta: SegmentDelta) -> LegacyLogprobs | None:
        if self.n_top is None:
            return None
        if self._offsets is None:
            self._offsets = TextOffsets(self.vocab, self.offset)
        tokens = [score.token for score in delta.logprobs]
        scored = legacy(tokens, delta.logprobs, self.vocab, n_top=self.n_top, offsets=self._offsets)
        self.logprobs.append(scored)
        return scored

    def _finish(self, finished: Finished) -> list[CompletionEvent]:
        self.finished = finished
        if finished.reason is FinishReason.CANCELLED:
            return []  # nobody is listening
        if finished.reason is FinishReason.ERROR:
            message = f"generation failed: {finished.error}"
            return [error_envelope(message, "server_error"), "[DONE]"]
        out: list[CompletionEvent] = [self._chunk("", None, self.finish_reason())]
        if self.include_usage:
            out.append(self.identity.chunk([], usage=self.usage()))
        out.append("[DONE]")
        return out

    def _chunk(
        self, text: str, logprobs: LegacyLogprobs | None, finish: str | None
    ) -> CompletionEvent:
        choice = {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self.identity.chunk([choice])
