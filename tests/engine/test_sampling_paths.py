"""Every sampling path of the engine on its edge cases: tiny temperatures, non-finite logits and
the generation's random stream.

A real LlamaContext on the tiny model decodes a short prompt; each test writes chosen logits into
llama.cpp's own logits buffer at that batch position and lets a TokenPicker (the engine's choice
of each next token) pick from it, through every path it has: the numpy sampler, llama.cpp's
chain (EngineConfig.sampler "llama"), banned tokens, an allowed set of header tokens, and a
grammar. The context is never decoded again while a picker runs, so every token of a test is
picked from the same logits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.directives import Allow, Constrain, Directive
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.picker import TokenPicker
from server.harmony.tokens import SPECIALS
from tests.support.chi_square import exact_distribution, goodness_of_fit

Floats = np.ndarray[Any, np.dtype[np.float32]]
PROMPT = [200006, 17360, 200008, 12194]  # <|start|>user<|message|>...
DIGITS = "root ::= [0-9]+"
TOP, SECOND = 1000, 2000  # the two likeliest tokens of the fixed logits (not digits)
TINY = [5e-324, 1e-300, 1e-45, 1e-40, 1e-38]  # 1/T or logits/T overflow (float64 or float32)
SETTINGS = {  # at temperature 1 and seed 3, which the tests replace
    "plain": SamplingParams(max_tokens=64, seed=3),
    "top-k": SamplingParams(max_tokens=64, top_k=40, seed=3),
    "top-p": SamplingParams(max_tokens=64, top_p=0.9, seed=3),
    "min-p": SamplingParams(max_tokens=64, min_p=0.05, seed=3),
}


@pytest.fixture(scope="module", params=["numpy", "llama"])
def ctx(request: pytest.FixtureRequest, tiny_gguf: Path) -> Iterator[LlamaContext]:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=256, n_threads=1, sampler=request.param)
    context = LlamaContext(config)
    yield context
    context.close()


@pytest.fixture(scope="module")
def digits(encoding: HarmonyEncoding) -> dict[str, int]:
    return {d: encoding.encode(d)[0] for d in "0123456789"}


class Script:
    """A steering that plays its directives in order, then repeats the last one."""

    def __init__(self, *directives: Directive) -> None:
        self._directives = directives
        self._at = 0
        self.accepted: list[int] = []

    def next(self) -> Directive:
        directive = self._directives[min(self._at, len(self._directives) - 1)]
        self._at += 1
        return directive

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def likely(self) -> tuple[int, ...]:
        return ()


def fixed_logits(n_vocab: int, seed: int = 5) -> Floats:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, n_vocab).astype(np.float32)
    logits[TOP], logits[SECOND] = 14.0, 13.0
    return logits


def position(ctx: LlamaContext, logits: Floats) -> int:
    """Decode the prompt afresh and put `logits` in llama.cpp's buffer at its last position."""
    ctx.truncate(0, 0)
    index = ctx.decode([BatchPart(0, PROMPT, 0, True)])[0]
    ctx.logits(index)[:] = logits
    return index


def pick(
    ctx: LlamaContext, index: int, params: SamplingParams, script: Script, n: int
) -> list[int]:
    picker = TokenPicker(ctx, params, script, None)
    out: list[int] = []
    try:
        while len(out) < n:
            for token in picker.next_tokens(index):
                picker.accept(token)
                out.append(token)
    finally:
        picker.free()
    return out[:n]


def _params(temperature: float, setting: str, seed: int | None = 3) -> SamplingParams:
    return dataclasses.replace(SETTINGS[setting], temperature=temperature, seed=seed)


# 1. temperatures whose 1/T or logits/T overflow act as greedy, on every path


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("temperature", TINY)
@pytest.mark.parametrize("path", ["free", "banned", "allow", "grammar"])
def test_tiny_temperatures_are_greedy(
    ctx: LlamaContext, digits: dict[str, int], path: str, temperature: float, setting: str
) -> None:
    logits = fixed_logits(ctx.info.n_vocab)
    allowed = (3000, 3001, 3002, 3003)
    logits[list(allowed)] = [3.0, 5.0, 4.9, 4.95]
    logits[digits["7"]] = 9.0  # the likeliest digit; the likeliest tokens are not digits
    logits[digits["8"]] = 8.9
    directive: Directive = {
        "free": None,
        "banned": Constrain(banned=frozenset({TOP})),
        "allow": Allow(allowed),
        "grammar": Constrain(banned=SPECIALS, grammar=DIGITS),
    }[path]
    expected = {"free": TOP, "banned": SECOND, "allow": 3001, "grammar": digits["7"]}[path]
    index = position(ctx, logits)
    tokens = pick(ctx, index, _params(temperature, setting), Script(directive), 6)
    assert tokens == [expected] * 6


# 2. sampling among allowed header tokens: llama.cpp's stages in its order, non-finite logits


ALLOWED = tuple(range(3000, 3008))
ALLOWED_LOGITS = [2.0, 1.6, 1.5, 1.0, 0.2, -0.5, -1.0, -3.0]
AMONG = {
    "temperature": SamplingParams(max_tokens=1, temperature=0.7, seed=11),
    "top-k": SamplingParams(max_tokens=1, temperature=1.5, top_k=3, seed=12),
    "top-p": SamplingParams(max_tokens=1, temperature=2.0, top_p=0.7, seed=13),
    "min-p": SamplingParams(max_tokens=1, temperature=1.0, min_p=0.3, seed=14),
    "all": SamplingParams(max_tokens=1, temperature=1.3, top_k=6, top_p=0.9, min_p=0.1, seed=15),
}


@pytest.mark.parametrize("case", sorted(AMONG))
def test_allowed_set_follows_llama_cpp_order(ctx: LlamaContext, case: str) -> None:
    """top-k, then top-p and min-p on the probabilities at temperature 1, then temperature:
    the tokens follow that distribution (chi-square), and only its support is drawn."""
    params = AMONG[case]
    logits = fixed_logits(ctx.info.n_vocab)
    logits[list(ALLOWED)] = ALLOWED_LOGITS
    outside = frozenset(range(ctx.info.n_vocab)) - set(ALLOWED)
    probs = exact_distribution(logits, params, outside)
    index = position(ctx, logits)
    tokens = pick(ctx, index, params, Script(Allow(ALLOWED)), 4000)
    assert {t for t in tokens if probs[t] == 0} == set()
    stat, critical = goodness_of_fit(tokens, probs)
    assert stat < critical, f"{case}: chi-square {stat:.1f} >= {critical:.1f}"


NAN, INF = math.nan, math.inf
NON_FINITE = {
    # name: (logits of the allowed tokens, the tokens that may be picked)
    "nan before the top": ([NAN, 1.0, 2.0, NAN], {3001, 3002}),
    "nan first": ([NAN, NAN, 0.5, 0.1], {3002, 3003}),
    "+inf": ([1.0, INF, NAN, 2.0], {3001}),
    "two +inf": ([INF, 1.0, INF, NAN], {3000, 3002}),
    "-inf": ([-INF, -INF, 0.5, -INF], {3002}),
    "only nan and -inf": ([NAN, -INF, NAN, -INF], set(range(3000, 3004))),
    "all nan": ([NAN, NAN, NAN, NAN], set(range(3000, 3004))),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1e-300])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_allowed_set_survives_non_finite_logits(
    ctx: LlamaContext, case: str, setting: str, temperature: float
) -> None:
    values, may = NON_FINITE[case]
    logits = fixed_logits(ctx.info.n_vocab)
    allowed = tuple(range(3000, 3004))
    logits[list(allowed)] = values
    index = position(ctx, logits)
    tokens = pick(ctx, index, _params(temperature, setting), Script(Allow(allowed)), 40)
    assert set(tokens) <= may, f"{case}: picked {sorted(set(tokens) - may)}"


# 5. greedy never picks a NaN logit


@pytest.mark.parametrize("path", ["free", "banned", "allow", "grammar"])
def test_greedy_never_picks_nan(ctx: LlamaContext, digits: dict[str, int], path: str) -> None:
    logits = fixed_logits(ctx.info.n_vocab)
    logits[[0, 1, 2, 500, 3000, digits["0"], digits["1"]]] = NAN  # NaN first, as numpy's argmax
    logits[[3001, 3002]] = [4.0, 5.0]
    logits[digits["7"]] = 9.0
    directive: Directive = {
        "free": None,
        "banned": Constrain(banned=frozenset({TOP})),
        "allow": Allow((3000, 3001, 3002)),
        "grammar": Constrain(banned=SPECIALS, grammar=DIGITS),
    }[path]
    expected = {"free": TOP, "banned": SECOND, "allow": 3002, "grammar": digits["7"]}[path]
    index = position(ctx, logits)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    assert pick(ctx, index, greedy, Script(directive), 4) == [expected] * 4


# 3. a grammar draws from the generation's own random stream


@pytest.mark.parametrize("setting", ["plain", "top-k"])
def test_constrained_stretch_continues_the_random_stream(
    ctx: LlamaContext, digits: dict[str, int], setting: str
) -> None:
    """With one seed and the same logits, a grammar-constrained stretch after free tokens does
    not replay the random numbers the generation started with: its tokens are not those of the
    same stretch at the start of a generation. And the whole generation repeats per seed."""
    logits = fixed_logits(ctx.info.n_vocab)
    logits[list(digits.values())] += 6.0  # the digits are likely, and several of them
    index = position(ctx, logits)
    params = _params(1.0, setting, seed=21)
    grammar = Constrain(banned=SPECIALS, grammar=DIGITS)
    n_free, n_constrained = 6, 16
    after_free = Script(*[None] * n_free, grammar)
    generation = pick(ctx, index, params, after_free, n_free + n_constrained)
    stretch = generation[n_free:]
    assert all(ctx.token_text(t).isdigit() for t in stretch)
    at_start = pick(ctx, index, params, Script(grammar), n_constrained)
    assert stretch != at_start, "the constrained stretch replayed the generation's first draws"
    # the same seed gives the same generation, free and constrained tokens alike
    again = pick(ctx, index, params, Script(*[None] * n_free, grammar), n_free + n_constrained)
    assert again == generation
