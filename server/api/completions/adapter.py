"""Completions' adapter: the request -> prompt token ids and the core's options, or a 400.

There is no transcript: a raw prompt is evaluated as given (server/core/raw.py). Texts are
encoded with harmony's special tokens only where `allow_special_tokens` lets them in.
"""

from __future__ import annotations

from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, HarmonyError

from server.api.completions.schemas import CompletionRequest
from server.contracts.errors import InvalidRequest, RequestField
from server.core.generation import GenerationOptions
from server.harmony.text_tokens import encode_text

WIRE_NAMES = {
    RequestField.CONVERSATION: "prompt",
    RequestField.MAX_TOKENS: "max_tokens",
}


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
            out.append(encode_text(encoding, item, bool(body.allow_special_tokens)))
        except HarmonyError as exc:
            raise InvalidRequest(
                f"{exc}".splitlines()[0] + " Send allow_special_tokens: true to use harmony's "
                "special tokens in a raw prompt.",
                param="prompt",
            ) from None
    return out


def generation_options(body: CompletionRequest) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=tuple(_stops(body)),
        logprobs=body.logprobs,
    )


def _stops(body: CompletionRequest) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
