"""A request seed gives the same tokens every time, on every sampling path of the real engine.

llama.cpp treats the seed 0xFFFFFFFF (LLAMA_DEFAULT_SEED) as "random": no request seed may reach
its sampler chains as that value, whatever it is (2**32 - 1, -1, which the core maps to
2**64 - 1, or a large seed whose low 32 bits are all ones). The tiny model's random weights give
flat distributions, so two runs that draw differently differ within a few tokens. Each prompt
runs once before the runs compared: those then both evaluate only its last token again (a cold
prompt's logits, from the whole prompt at once, may differ from those in the last bits).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from server.contracts.directives import Constrain, Directive
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama import LlamaEngine
from server.harmony.tokens import SPECIALS
from tests.support.engine_runs import run, unique_prompt

SEEDS = [2**32 - 1, 2**64 - 1, 2**33 - 1, 12345]
DIGITS = "root ::= [0-9]+"


@pytest.fixture(scope="module")
def llama_engine(tiny_gguf: Path) -> Iterator[LlamaEngine]:
    """An engine sampling through llama.cpp's own chain (EngineConfig.sampler "llama")."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2, sampler="llama")
    engine = LlamaEngine(config)
    yield engine
    engine.close()


class Digits:
    """Free tokens first, then a grammar: digits only."""

    def __init__(self, n_free: int = 4) -> None:
        self._n_free = n_free
        self._n = 0

    def next(self) -> Directive:
        self._n += 1
        return None if self._n <= self._n_free else Constrain(banned=SPECIALS, grammar=DIGITS)

    def accept(self, token: int) -> None:
        pass

    def likely(self) -> tuple[int, ...]:
        return ()


def twice(
    engine: LlamaEngine,
    prompt: list[int],
    params: SamplingParams,
    steering: type[Digits] | None = None,
) -> tuple[list[int], list[int]]:
    """The tokens of two runs of one request, after a run that warms the prompt's cache."""
    outputs = []
    for _ in range(3):
        tokens, _ = run(engine, prompt, params, steering() if steering is not None else None)
        outputs.append(tokens)
    return outputs[1], outputs[2]


@pytest.mark.parametrize("seed", SEEDS)
def test_llama_chain_repeats_every_seed(
    llama_engine: LlamaEngine, encoding: HarmonyEncoding, seed: int
) -> None:
    prompt = unique_prompt(encoding, "seeds on llama.cpp's chain")
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=seed)
    first, second = twice(llama_engine, prompt, params)
    assert first == second, f"seed {seed:#x} drew differently"


@pytest.mark.parametrize("seed", [2**32 - 1, 2**32 - 2, 2**64 - 1])
@pytest.mark.parametrize("sampler", ["numpy", "llama"])
def test_grammar_stretch_repeats_every_seed(
    engine: LlamaEngine,
    llama_engine: LlamaEngine,
    encoding: HarmonyEncoding,
    sampler: str,
    seed: int,
) -> None:
    """Free tokens, then a grammar under top-k (llama.cpp's chains inside the grammar sampler):
    the whole generation repeats."""
    chosen = engine if sampler == "numpy" else llama_engine
    prompt = unique_prompt(encoding, "seeds under a grammar")
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=40, seed=seed)
    first, second = twice(chosen, prompt, params, Digits)
    assert first == second, f"seed {seed:#x} drew differently"


def test_other_seeds_draw_otherwise(llama_engine: LlamaEngine, encoding: HarmonyEncoding) -> None:
    """The checks above can fail: different seeds (also ones equal modulo 2**32) differ."""
    prompt = unique_prompt(encoding, "seeds on llama.cpp's chain")
    run(llama_engine, prompt, SamplingParams(max_tokens=1))
    outputs = []
    for seed in (1, 2, 1 + 2**32):
        tokens, _ = run(llama_engine, prompt, SamplingParams(max_tokens=12, seed=seed))
        outputs.append(tokens)
    assert len({tuple(o) for o in outputs}) == 3
