"""Completions wire shapes: the pydantic request model, TypedDict response shapes.

Requests are lenient (unknown fields are ignored). `prompt` is a text, a list of texts, token
ids, or a list of token-id lists (one choice each); `logprobs` is legacy's integer (how many
alternatives per token, up to 20); `allow_special_tokens` (an extension) lets harmony's special
tokens into a raw prompt.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from server.api.logprobs import LegacyLogprobs

MAX_TOP_LOGPROBS = 20


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1)
    best_of: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None
    allow_special_tokens: bool = False


class CompletionChoice(TypedDict):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


class Completion(TypedDict, total=False):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None
