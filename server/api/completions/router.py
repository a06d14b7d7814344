"""POST /v1/completions: raw prompts (text or token ids), echo, logprobs, streaming.

Each prompt is one choice, generated side by side in the batch (server/core/raw.py). With
`echo`, the prompt comes back before the completion, and with `logprobs` each prompt token's
logprob too (the first is null: nothing comes before it): what loglikelihood evaluation reads.
`max_tokens: 0` evaluates the prompt only. Text is cut at a `stop` string; the engine's stop
token (<|return|>, <|call|>, <|end|>, <|endoftext|>) ends the completion: it is not part of the
text, but is listed with its logprob (every generated token is; clients such as lm-eval count on
`max_tokens` tokens after the prompt).
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from openai_harmony import HarmonyEncoding, HarmonyError

from server.api.completions.schemas import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    CompletionUsage,
)
from server.api.logprobs import LegacyLogprobs, joined, legacy
from server.api.response_fields import new_id, now
from server.api.sse import DONE, sse_data, sse_response
from server.contracts.errors import InvalidRequest, RequestField, ServerError, error_envelope
from server.contracts.events import TokenLogprob
from server.core.generation import GenerationOptions, Generator
from server.core.raw import RawGeneration, prepare_raw
from server.engine.base import EngineResult, StopReason
from server.harmony.token_bytes import TokenBytes

router = APIRouter()

WIRE_NAMES = {
    RequestField.CONVERSATION: "prompt",
    RequestField.MAX_TOKENS: "max_tokens",
}


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    generator: Generator = request.app.state.generator
    model = body.model or request.app.state.model_name
    try:
        check_supported(body)
        prompts = prompt_tokens(body, generator.encoding)
        runs = _prepare(generator, prompts, body)
    except ServerError as exc:
        raise exc.named(WIRE_NAMES) from None
    vocab = generator.token_bytes
    identity = (new_id("cmpl-"), now(), model)
    if body.stream:
        return sse_response(_stream(runs[0], body, vocab, identity))
    choices = await asyncio.gather(
        *(_complete(index, run, body, vocab) for index, run in enumerate(runs))
    )
    usage = _usage([result for _, result in choices], [len(p) for p in prompts])
    completion = Completion(
        id=identity[0],
        object="text_completion",
        created=identity[1],
        model=identity[2],
        choices=[choice for choice, _ in choices],
        usage=usage,
    )
    return JSONResponse(completion)


def check_supported(body: CompletionRequest) -> None:
    if body.n not in (None, 1) or body.best_of not in (None, 1):
        raise InvalidRequest("only n=1 (and best_of=1) is supported; send several prompts")
    if body.suffix:
        raise InvalidRequest("suffix (fill-in-the-middle) is not supported", param="suffix")
    if body.stream and body.echo:
        raise InvalidRequest("echo is not supported with stream: true", param="echo")


def prompt_tokens(body: CompletionRequest, encoding: HarmonyEncoding) -> list[list[int]]:
    """The prompts as token ids: texts are encoded (harmony's specials only where the request
    allows them: else their text is refused), ids are taken as they are."""
    prompt = body.prompt
    if isinstance(prompt, str):
        items: Sequence[str | list[int]] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [[p for p in prompt if isinstance(p, int)]]
    else:
        items = [p for p in prompt if not isinstance(p, int)]
    if not items:
        raise InvalidRequest("the prompt is empty", param="prompt")
    if body.stream and len(items) > 1:
        raise InvalidRequest("stream: true takes one prompt", param="prompt")
    out = []
    for item in items:
        if isinstance(item, list):
            out.append(item)
            continue
        try:
            out.append(
                encoding.encode(item, allowed_special="all" if body.allow_special_tokens else set())
            )
        except HarmonyError as exc:
            raise InvalidRequest(
                f"{exc}".splitlines()[0] + " Send allow_special_tokens: true to use harmony's "
                "special tokens in a raw prompt.",
                param="prompt",
            ) from None
    return out


def _prepare(
    generator: Generator, prompts: list[list[int]], body: CompletionRequest
) -> list[RawGeneration]:
    options = GenerationOptions(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        logprobs=body.logprobs,
    )
    scored = body.echo and body.logprobs is not None
    runs: list[RawGeneration] = []
    try:
        for tokens in prompts:
            runs.append(
                prepare_raw(
                    generator,
                    tokens,
                    options,
                    prompt_logprobs=scored,
                    specials=body.allow_special_tokens,
                )
            )
    except BaseException:
        for run in runs:
            run.ticket.release()
        raise
    return runs


class _Text:
    """The completion's text as its tokens come: bytes joined across tokens (a character may
    span several), cut at the first stop string, a possible stop string's start held back."""

    def __init__(self, vocab: TokenBytes, stops: Sequence[str]) -> None:
        self._vocab = vocab
        self._stops = [s for s in stops if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, tokens: Sequence[int], *, final: bool = False) -> str:
        """Add tokens; the text that can go out now (nothing once a stop string appeared:
        bytes the decoder holds from tokens after it are not the completion's)."""
        if self.stopped:
            return ""
        data = b"".join(self._vocab.of(t) for t in tokens)
        self.text += self._decoder.decode(data, final=final)
        cuts = [i for stop in self._stops if (i := self.text.find(stop)) >= 0]
        if cuts:
            self.text, self.stopped = self.text[: min(cuts)], True
        safe = len(self.text) if self.stopped or final else len(self.text) - self._held()
        out, self.sent = self.text[self.sent : safe], max(self.sent, safe)
        return out

    def _held(self) -> int:
        for keep in range(min(len(self.text), max(map(len, self._stops), default=1) - 1), 0, -1):
            if any(stop.startswith(self.text[-keep:]) for stop in self._stops):
                return keep
        return 0


def _stops(body: CompletionRequest) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


async def _complete(
    index: int, run: RawGeneration, body: CompletionRequest, vocab: TokenBytes
) -> tuple[CompletionChoice, EngineResult]:
    text = _Text(vocab, _stops(body))
    tokens: list[int] = []
    scores: list[TokenLogprob | None] = []
    async with aclosing(run.chunks()) as chunks:
        async for chunk in chunks:
            tokens += chunk
            scores += chunk.logprobs
            text.add([t for t in chunk if t not in run.params.stop_tokens])
            if text.stopped:
                break
    text.add((), final=True)
    result = await run.result(stopped="stop" if text.stopped else None)
    _raise_failure(result)
    prefix = vocab_text(vocab, run.prompt_tokens) if body.echo else ""
    logprobs: LegacyLogprobs | None = None
    if body.logprobs is not None:
        n_top = body.logprobs
        parts = []
        if body.echo:
            parts.append(legacy(run.prompt_tokens, result.prompt_logprobs, vocab, n_top=n_top))
        generated = legacy(tokens, scores, vocab, n_top=n_top, offset=len(prefix))
        parts.append(_cut(generated, len(prefix) + len(text.text)) if text.stopped else generated)
        logprobs = joined(parts)
    choice = CompletionChoice(
        index=index,
        text=prefix + text.text,
        logprobs=logprobs,
        finish_reason=_finish_reason(result, stopped=text.stopped),
    )
    return choice, result


def vocab_text(vocab: TokenBytes, tokens: Sequence[int]) -> str:
    return b"".join(vocab.of(t) for t in tokens).decode("utf-8", errors="replace")


def _cut(logprobs: LegacyLogprobs, end: int) -> LegacyLogprobs:
    """The entries of the tokens that start before `end` (the text was cut at a stop string)."""
    n = sum(offset < end for offset in logprobs["text_offset"])
    return LegacyLogprobs(
        tokens=logprobs["tokens"][:n],
        token_logprobs=logprobs["token_logprobs"][:n],
        top_logprobs=logprobs["top_logprobs"][:n],
        text_offset=logprobs["text_offset"][:n],
    )


def _raise_failure(result: EngineResult) -> None:
    if result.stop_reason is StopReason.ERROR:
        raise ServerError(f"generation failed: {result.error}")


def _finish_reason(result: EngineResult, *, stopped: bool) -> Literal["stop", "length"]:
    if stopped or result.stop_reason is StopReason.STOP_TOKEN:
        return "stop"
    return "length"


def _usage(results: Sequence[EngineResult], prompt_lengths: Sequence[int]) -> CompletionUsage:
    completion = sum(r.usage.completion_tokens for r in results)
    prompt = sum(prompt_lengths)
    return CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details={"cached_tokens": sum(r.usage.cached_tokens for r in results)},
    )


async def _stream(
    run: RawGeneration,
    body: CompletionRequest,
    vocab: TokenBytes,
    identity: tuple[str, int, str],
) -> AsyncIterator[bytes]:
    cid, created, model = identity

    def chunk(text: str, logprobs: LegacyLogprobs | None, finish: str | None) -> dict[str, object]:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    text = _Text(vocab, _stops(body))
    async with aclosing(run.chunks()) as chunks:
        async for tokens in chunks:
            offset = len(text.text)
            delta = text.add([t for t in tokens if t not in run.params.stop_tokens])
            logprobs = None
            if body.logprobs is not None:
                logprobs = legacy(
                    tokens, tokens.logprobs, vocab, n_top=body.logprobs, offset=offset
                )
            if delta or (logprobs is not None and logprobs["tokens"]):
                yield sse_data(chunk(delta, logprobs, None))
            if text.stopped:
                break
    rest = text.add((), final=True)
    result = await run.result(stopped="stop" if text.stopped else None)
    if result.stop_reason is StopReason.ERROR:
        yield sse_data(error_envelope(f"generation failed: {result.error}", "server_error"))
        yield DONE
        return
    yield sse_data(chunk(rest, None, _finish_reason(result, stopped=text.stopped)))
    if body.stream_options is not None and body.stream_options.include_usage:
        usage = _usage([result], [len(run.prompt_tokens)])
        yield sse_data(
            {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
    yield DONE
