"""Logprobs on the wire: the engine's TokenLogprob -> OpenAI's shapes.

Chat Completions and Responses list `{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}` per token; legacy Completions has parallel lists (`tokens`, `token_logprobs`,
`top_logprobs` as {token: logprob} maps, `text_offset`: where each token starts in the text, in
characters, as OpenAI's). The values are the model's own log-probabilities
(docs/sampling.md#log-probabilities).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TypedDict

from server.contracts.events import TokenLogprob
from server.harmony.token_bytes import TokenBytes

FLOOR = -9999.0  # OpenAI's stand-in for a probability of zero (JSON has no -inf)


class TopLogprobOut(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobOut]


class LegacyLogprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def token_entries(scores: Sequence[TokenLogprob], vocab: TokenBytes) -> list[TokenLogprobOut]:
    """Chat's and Responses' entries, one per token."""
    return [
        TokenLogprobOut(
            token=vocab.text(score.token),
            logprob=_value(score.logprob),
            bytes=list(vocab.of(score.token)),
            top_logprobs=[
                TopLogprobOut(token=vocab.text(t), logprob=_value(lp), bytes=list(vocab.of(t)))
                for t, lp in score.top
            ],
        )
        for score in scores
    ]


class TextOffsets:
    """Where each token of a text starts, in characters: the characters its predecessors
    completed (a character whose bytes span several tokens counts once, at the token that
    completes it; the tokens before it start where it starts)."""

    def __init__(self, vocab: TokenBytes, start: int = 0) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.at = start

    def next(self, token: int) -> int:
        """`token`'s offset; the text after it starts past its characters."""
        at = self.at
        self.at += len(self._decoder.decode(self._vocab.of(token)))
        return at


def legacy(
    tokens: Sequence[int],
    scores: Sequence[TokenLogprob | None],
    vocab: TokenBytes,
    *,
    n_top: int,
    offsets: TextOffsets,
) -> LegacyLogprobs:
    """Legacy Completions' lists for `tokens` (a None score: the first prompt token's, or one
    never computed), their offsets from `offsets`."""
    out = LegacyLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for token, score in zip(tokens, scores, strict=True):
        out["tokens"].append(vocab.text(token))
        out["text_offset"].append(offsets.next(token))
        if score is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(_value(score.logprob))
        top: dict[str, float] = {}
        for t, lp in score.top[:n_top]:
            top.setdefault(vocab.text(t), _value(lp))
        out["top_logprobs"].append(top)
    return out


def joined(parts: Sequence[LegacyLogprobs]) -> LegacyLogprobs:
    out = LegacyLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for part in parts:
        out["tokens"] += part["tokens"]
        out["token_logprobs"] += part["token_logprobs"]
        out["top_logprobs"] += part["top_logprobs"]
        out["text_offset"] += part["text_offset"]
    return out
