"""Free text drawn inside the graph by llama.cpp's backend chain, against the host's sampler, on
the real tiny model.

- The distribution: at one fixed context, thousands of draws of the engine's backend path (the
  picker's chain set on the sequence, the token read back) fit the exact distribution of the
  host's logits at temperature 1, and are homogeneous with the host sampler's draws; the same
  draws fail the test against a wrong temperature, and a chain whose drawn tokens are never
  accepted draws the same token every step (llama.cpp's transactional draw).
- The seed: the same seed gives the same tokens through the engine, another seed others.
- Greedy: the backend's and the host's tokens are the same through a whole generation whose
  steering switches between free text, forced tokens and allowed sets (each switch a chain
  taken off or set again).
- What it does not serve (logprobs, top-p, a grammar) never reaches the backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.contracts.directives import Allow, Constrain, Directive, Force
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama import LlamaEngine
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.picker import TokenPicker
from server.harmony.tokens import CHANNEL, END, MESSAGE, SPECIALS
from tests.support.chi_square import exact_distribution, goodness_of_fit, homogeneity
from tests.support.engine_runs import run

pytestmark = pytest.mark.slow  # thousands of real decodes

PROMPT = [200006, 17360, 200008, 12194, 3030, 4040]  # <|start|>user<|message|>...
N_DRAWS = 3000
CONTENT = Constrain(banned=SPECIALS - {END})


class Script:
    """A steering that plays its directives in order, then repeats them from the start."""

    def __init__(self, *directives: Directive) -> None:
        self._directives = directives
        self._at = 0

    def next(self) -> Directive:
        directive = self._directives[self._at % len(self._directives)]
        self._at += 1
        return directive

    def accept(self, token: int) -> None:
        pass

    def likely(self) -> tuple[int, ...]:
        return ()


def headers() -> Script:
    """Free text, then a header: the end forced, a channel picked among three, the message."""
    return Script(
        *[CONTENT] * 5, Force((END, 200006, CHANNEL)), Allow((1000, 2000, 3000)), Force((MESSAGE,))
    )


@pytest.fixture(scope="module")
def ctx(tiny_gguf: Path) -> Iterator[LlamaContext]:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=256, n_slots=1, n_threads=2)
    context = LlamaContext(config)
    yield context
    context.close()


def last_token_again(ctx: LlamaContext) -> int:
    """The prompt's last token evaluated again at its position: the same context each time."""
    ctx.truncate(0, len(PROMPT) - 1)
    (index,) = ctx.decode([BatchPart(0, PROMPT[-1:], len(PROMPT) - 1, True)])
    return index


def backend_draws(ctx: LlamaContext, params: SamplingParams, n: int) -> list[int]:
    """`n` tokens the engine's backend path draws at the fixed context."""
    picker = TokenPicker(ctx, params, Script(CONTENT), None, seq_id=0, backend=True)
    draws = []
    try:
        for _ in range(n):
            assert picker.next_pick() is True
            picker.sample_on_backend(True)
            (token,) = picker.next_tokens(last_token_again(ctx))
            draws.append(token)
        assert picker.switches == 1  # set once, kept while the free text goes on
    finally:
        picker.free()
    return draws


def host_logits(ctx: LlamaContext) -> Any:
    ctx.set_backend_chain(0, None)
    return np.array(ctx.logits(last_token_again(ctx)))  # a copy: the next decode rewrites it


def test_backend_draws_follow_the_host_distribution(ctx: LlamaContext) -> None:
    params = SamplingParams(max_tokens=N_DRAWS, temperature=1.0, seed=11)
    logits = host_logits(ctx)
    draws = backend_draws(ctx, params, N_DRAWS)
    exact = exact_distribution(logits, params, CONTENT.banned)
    stat, critical = goodness_of_fit(draws, exact)
    assert stat < critical, (stat, critical)
    assert not set(draws) & CONTENT.banned
    host = TokenPicker(ctx, params, Script(CONTENT), None)  # the host's sampler
    index = last_token_again(ctx)
    host_draws = [host.next_tokens(index)[0] for _ in range(N_DRAWS)]
    stat, critical = homogeneity(draws, host_draws, exact)
    assert stat < critical, (stat, critical)
    # the negative control: the same draws against the distribution at a wrong temperature
    for wrong in (0.7, 1.4):
        wrong_params = dataclasses.replace(params, temperature=wrong)
        other = exact_distribution(logits, wrong_params, CONTENT.banned)
        stat, critical = goodness_of_fit(draws, other)
        assert stat > critical, (wrong, stat, critical)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the engine set or took off a chain, and read a drawn token back."""
    calls = {"set": 0, "clear": 0, "read": 0}
    set_chain, read = LlamaContext.set_backend_chain, LlamaContext.sampled_token

    def set_backend_chain(self: LlamaContext, seq_id: int, chain: Any) -> bool:
        calls["set" if chain is not None else "clear"] += 1
        return set_chain(self, seq_id, chain)

    def sampled_token(self: LlamaContext, index: int) -> int:
        calls["read"] += 1
        return read(self, index)

    monkeypatch.setattr(LlamaContext, "set_backend_chain", set_backend_chain)
    monkeypatch.setattr(LlamaContext, "sampled_token", sampled_token)
    return calls


def engine_of(tiny_gguf: Path, backend: str, **fields: Any) -> LlamaEngine:
    config = EngineConfig(
        model_path=str(tiny_gguf), n_ctx=1024, n_threads=2, backend_sampling=backend, **fields
    )
    return LlamaEngine(config)


def test_the_same_seed_gives_the_same_tokens(tiny_gguf: Path, counted: dict[str, int]) -> None:
    engine = engine_of(tiny_gguf, "on", speculative="on")
    try:
        outputs: dict[int, list[list[int]]] = {}
        for seed in (5, 5, 6):
            params = SamplingParams(max_tokens=40, temperature=1.0, seed=seed)
            tokens, _ = run(engine, PROMPT, params, headers())
            outputs.setdefault(seed, []).append(tokens)
    finally:
        engine.close()
    assert outputs[5][0] == outputs[5][1]
    assert outputs[6][0] != outputs[5][0]
    # the free text was drawn on the backend (but a prompt's first pick), the chain taken off
    # at every header and set again after it
    assert counted["read"] >= 3 * 15
    assert counted["set"] >= 3 * 4
    assert counted["clear"] >= 3 * 4


def test_greedy_is_the_hosts_through_header_switches(
    tiny_gguf: Path, counted: dict[str, int]
) -> None:
    params = SamplingParams(max_tokens=80, temperature=0.0)
    outputs: dict[str, list[int]] = {}
    for backend in ("off", "on"):
        engine = engine_of(tiny_gguf, backend, speculative="off")
        try:
            run(engine, PROMPT, SamplingParams(max_tokens=1))  # both evaluate the last token again
            outputs[backend], _ = run(engine, PROMPT, params, headers())
        finally:
            engine.close()
        if backend == "off":
            assert counted == {"set": 0, "clear": 0, "read": 0}
    assert outputs["on"] == outputs["off"]
    assert len(outputs["on"]) == 80
    assert counted["read"] >= 8 * 5 - 1  # every free token but the prompt's first pick
    assert counted["set"] >= 8
    assert counted["clear"] >= 8


@pytest.mark.parametrize(
    ("params", "steering"),
    [
        (SamplingParams(max_tokens=12, logprobs=2), None),
        (SamplingParams(max_tokens=12, top_p=0.9), None),
        (SamplingParams(max_tokens=12), Script(Constrain(grammar="root ::= [0-9]+"))),
    ],
)
def test_what_the_backend_does_not_serve_stays_on_the_host(
    tiny_gguf: Path,
    counted: dict[str, int],
    params: SamplingParams,
    steering: Script | None,
) -> None:
    engine = engine_of(tiny_gguf, "on")
    try:
        tokens, result = run(engine, PROMPT, params, steering)
    finally:
        engine.close()
    assert len(tokens) == 12
    assert result.error is None
    assert counted == {"set": 0, "clear": 0, "read": 0}
